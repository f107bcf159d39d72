"""Whether a late-bound job's inputs may be run by the pilot's agent itself, and how (issue 55).

A claim's inputs are run by the job script's bash: a fork of its shell per input, and one more for the program,
about 6 ms of CPU an input on this machine's test cluster, the largest share of a no-op input's cost. Where an input
needs nothing of the script but its program (one chain; no container, database, merge, QA, staging, input checksums,
burst buffer, modules, work directory or site template), the job script carries a recipe on one comment line
(``# hpcrun-direct: <json>``): the environment the script would export, the chain's environment and the program's
words (literal text and variables, never shell). The agent then runs the claim with the plan's Python worker
(``bin/hpcrun_late_direct.py``: hpcrun/backends/late/direct.py), which keeps the script's files, lines and exit
codes. The decision is made here, and carried by each job script, so a pilot runs any generation's script rightly.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Dict, List, Optional

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.values import Plan
from hpcrun.shell import Shell, quote

_CLAIM_DIRS = '/"${HPCRUN_JOB}"/"${HPCRUN_JOB_ID}"'   # a claim's work directory under the plan's (late_dirs)


def _needs_the_script(plan: Plan, ctx: Dict[str, Any]) -> bool:
    """Whether an input needs anything of the job script beyond its one program."""
    p = plan.pilots
    return bool(
        p is None or not plan.campaign.jobs.pilot or not plan.campaign.jobs.pilot.direct or p.chains != 1
        or plan.campaign.jobs.nodes != 1 or plan.campaign.jobs.files_per_job != 1
        or not ctx["agent_sums"] or not ctx["chain_here"]
        or not ctx["rows_spared"] or ctx["work_dir_made"] or ctx["database"] or ctx["merge"] or ctx["qa"]
        or ctx["modules"] or ctx["runtime_setup"] or str(ctx["runtime_prefix"]) or ctx["remote"]
        or ctx["claim_copies"] or ctx["checksum"] or ctx["staged_by_stem"] or str(ctx["input_dir_expr"]) != '""'
        or not ctx["in_batch"] or not ctx["chain_inline"] or ctx["provenance"]["image_id"] is not None
        or plan.bb_system or p.bb_root is not None)


def _literal(expr: str) -> Optional[str]:
    """The one literal word a shell expression is (as ``quote`` wrote it), or None."""
    try:
        words = shlex.split(expr)
    except ValueError:
        return None
    return words[0] if len(words) == 1 and quote(words[0]) == expr else None


def recipe(plan: Plan, ctx: Dict[str, Any]) -> Optional[Shell]:
    """The recipe line's JSON (ASCII, one line), or None where an input runs through the script."""
    if _needs_the_script(plan, ctx):
        return None
    argv = ph.to_parts(plan.campaign.chain.command)
    work = plan.work_dir_expr
    base = _literal(work[:-len(_CLAIM_DIRS)]) if work.endswith(_CLAIM_DIRS) else None
    if argv is None or base is None or ph.to_shell(plan.campaign.chain.command) != plan.commands.get("chain"):
        return None
    if any(p[1:] not in ph.VARIABLES.values() for word in argv for p in word if p.startswith("$")):
        return None   # {env:NAME}: bash gives its own variables and the script's, exported or not; a worker cannot
    env: List[List[str]] = [["HPCRUN_CAMPAIGN", ctx["campaign"]], ["HPCRUN_PLAN_DIR", ctx["plan_dir"]]]
    if ctx["cluster"]:
        env.append(["HPCRUN_CLUSTER", ctx["cluster"]])
    env += [["HPCRUN_NODE_KEY", ctx["node_key"]], ["HPCRUN_RELEASE", ctx["release"]]]
    env += [[str(k), str(v)] for k, v in ctx["env"]] + [["HPCRUN_NODES", "1"]]
    body = {"v": 1, "env": env, "chain_env": [[str(k), str(v)] for k, v in ctx["chain_env"]], "argv": argv,
            "outdir": ctx["agent_sums"]["base"], "algo": ctx["agent_sums"]["algo"], "workdir": base,
            "generation": ctx["generation"], "tasks_base": ctx["tasks_base"],
            "node_var": scheduler_for(plan.scheduler).node_env,
            "killed": [int(k) for k in str(ctx["killed_statuses"]).split(" | ")]}
    return Shell(json.dumps(body, ensure_ascii=True, separators=(",", ":")))
