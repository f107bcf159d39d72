"""Failure classes: how a job's end (the job script's exit code, the scheduler's state) is classed, and each
class's default rule. Plain Python, no pydantic: ``hpcrun run``, ``status`` and ``retry`` decide with this and
the manifest's frozen rules, and so start without loading the spec's models (hpcrun/model/retry.py validates
the spec's ``retry`` section against these classes at plan time).

The defaults follow what operators of long productions do by hand: retry what is transient, change what caused
it (more time after a time limit, more memory after running out, another node after a node failure), and park at
once what fails the same way every time (a QA failure, a missing input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class FailureClass:
    name: str
    cause: str
    retry: bool = True
    max_attempts: Optional[int] = None        # None: the spec's retry.max_attempts
    more_walltime: Optional[float] = None     # factor
    more_memory: Optional[float] = None       # factor
    exclude_node: bool = False
    restage: bool = False


# The job's exit codes (templates/base.sh.j2) and the scheduler's end states, in one table.
FAILURE_CLASSES: Tuple[FailureClass, ...] = (
    FailureClass("setup", "exit 3: an input missing or unreadable, a helper missing", retry=False),
    FailureClass("payload", "exit 4: the database payload copy failed"),
    FailureClass("db_not_ready", "exit 5: the database server never answered"),
    FailureClass("db_died", "exit 6: the database server died during the chains"),
    FailureClass("chain", "exit 7: a chain's program failed by itself (non-zero exit, or a crash such as "
                 "SIGSEGV): the same input fails the same way", max_attempts=2),
    FailureClass("chain_killed", "exit 14: a chain was killed from outside (SIGKILL, SIGTERM, SIGINT, SIGHUP, "
                 "SIGXCPU: the OOM killer, a node health check) with no chain failing by itself",
                 exclude_node=True),
    FailureClass("merge", "exit 8: the merge failed", max_attempts=2),
    FailureClass("qa", "exit 9: QA failed (the same input gives the same events)", retry=False),
    FailureClass("time_limit", "exit 10, TIMEOUT or DEADLINE: the time limit was reached", more_walltime=1.5),
    FailureClass("allocation", "TIMEOUT well before the job's time limit: Slurm ended the running job because "
                 "the account's allocation ran out (GrpTRESMins) or its limit was shortened; not the job's "
                 "length, so retried unchanged (it starts once the limit is raised)", max_attempts=10),
    FailureClass("checksum", "exit 11: an input's checksum did not match", max_attempts=2, restage=True),
    FailureClass("placement", "exit 12: a late-bound input's outputs could not be moved into the outputs location "
                 "(a quota, a full disk, a name in the way): they stay in the claim's own directory, never deleted, "
                 "and the input runs again", max_attempts=3),
    FailureClass("transfer", "exit 13: an input could not be copied from its server (unreachable, timed "
                 "out) after the job's own retries", max_attempts=3),
    FailureClass("export", "an output could not be copied to outputs.export or verified there: the supervisor "
                 "copies it again (the job is not rerun); the output stays where it is", max_attempts=8),
    FailureClass("out_of_memory", "OUT_OF_MEMORY", more_memory=1.5),
    FailureClass("node_fail", "NODE_FAIL: a node died under the job", exclude_node=True),
    FailureClass("boot_fail", "BOOT_FAIL: a node did not boot", exclude_node=True),
    FailureClass("preempted", "PREEMPTED: another job took the nodes", max_attempts=10),
    FailureClass("cancelled", "CANCELLED through `hpcrun cancel`: an operator's decision", retry=False),
    FailureClass("site_cancel", "CANCELLED by anyone else (an administrator before a maintenance or to free a "
                 "node, a site script): not the campaign's decision, so retried", max_attempts=5),
    FailureClass("lost", "the job left the queue without an accounting record"),
    FailureClass("other", "any other failure"),
)
CLASS_NAMES: Tuple[str, ...] = tuple(c.name for c in FAILURE_CLASSES)
# Signals that kill a chain from outside (the OOM killer, a health check, an operator): the chain
# ends ``killed`` (exit 14, chain_killed); any other signal is the program's own crash (``chain``).
KILL_SIGNALS: Dict[int, str] = {1: "SIGHUP", 2: "SIGINT", 9: "SIGKILL", 15: "SIGTERM", 24: "SIGXCPU"}
EXIT_CLASSES: Dict[int, str] = {3: "setup", 4: "payload", 5: "db_not_ready", 6: "db_died", 7: "chain", 8: "merge",
                                9: "qa", 10: "time_limit", 11: "checksum", 12: "placement",
                                13: "transfer", 14: "chain_killed"}
STATE_CLASSES: Dict[str, str] = {"TIMEOUT": "time_limit", "DEADLINE": "time_limit", "OUT_OF_MEMORY": "out_of_memory",
                                 "NODE_FAIL": "node_fail", "BOOT_FAIL": "boot_fail", "PREEMPTED": "preempted",
                                 "REVOKED": "preempted", "CANCELLED": "cancelled", "LOST": "lost"}


def classify(state: Optional[str], exit_code: Optional[int], by_operator: bool = False, early: bool = False) -> str:
    """The failure class of a job that ended in ``state`` with ``exit_code``; ``by_operator``: the
    campaign's operators asked hpcrun to cancel it (only those cancellations are theirs); ``early``: it
    ran well short of its time limit (a TIMEOUT then is a limit of the account, not of the job)."""
    if by_operator and state in ("CANCELLED", "LOST"):
        return "cancelled"
    if state == "TIMEOUT" and early:
        return "allocation"
    if state == "CANCELLED":
        return "site_cancel"
    if state in STATE_CLASSES:
        return STATE_CLASSES[state]
    if exit_code is not None and exit_code in EXIT_CLASSES:
        return EXIT_CLASSES[exit_code]
    return "other"


def default_rules(max_attempts: int, cancelled: bool = False) -> Dict[str, Dict[str, Any]]:
    """Every class's default rule, for a spec whose ``retry.max_attempts`` and ``retry.cancelled`` are these."""
    return {c.name: {"retry": c.retry if c.name != "cancelled" else cancelled,
                     "max_attempts": c.max_attempts or max_attempts, "more_walltime": c.more_walltime,
                     "more_memory": c.more_memory, "exclude_node": c.exclude_node, "restage": c.restage}
            for c in FAILURE_CLASSES}
