"""The detector-reco-local example as a campaign on the test cluster, driven through hpcrun as the
test user: shared by the end-to-end tests and the campaign-state tests.

The fixtures (`hpcrun_bin`, `example_root`) live in tests/cluster/conftest.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import yaml

from hpcrun.backends.late import ledger
from hpcrun.operate.outputs import folding

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLE = REPO / "examples" / "detector-reco-local"
PY = "/usr/bin/python3"


def source_digest() -> str:
    h = hashlib.sha256()
    for base in ("hpcrun", "templates", "site-profiles"):
        for p in sorted((REPO / base).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(REPO)).encode())
                h.update(p.read_bytes())
    h.update((REPO / "setup.cfg").read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def supervising(sup: subprocess.Popen, timeout: float, cleanup: Callable[[], None] = lambda: None
                ) -> Iterator[subprocess.Popen]:
    """A running `hpcrun run` (its output piped) while the block acts on the campaign; it must then end by
    itself, exit 0 (``sup.stdout_text`` holds what it printed). When the block fails it is killed and
    ``cleanup`` runs (say, cancel what it left queued)."""
    try:
        yield sup
        out, err = sup.communicate(timeout=timeout)
        sup.stdout_text = out   # type: ignore[attr-defined]
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.communicate()
            cleanup()
    assert sup.returncode == 0, out[-3000:] + err[-3000:]


class Campaign:
    """One variant of the example campaign in its own directory, driven through hpcrun."""

    def __init__(self, cluster, hpcrun: str, root: Path, name: str, chain_extra=(), **changes):
        self.cluster, self.hpcrun = cluster, hpcrun
        data = yaml.safe_load((EXAMPLE / "campaign.yaml").read_text())
        data["name"] = self.name = f"e2e-{name}"
        data["chain"]["command"] += list(chain_extra)
        for key, value in changes.items():
            section, _, field = key.partition("__")
            if field:
                data.setdefault(section, {})[field] = value
            elif value is None:
                data.pop(section, None)
            else:
                data[section] = value
        self.out = root / "out" / name
        data["outputs"]["location"] = str(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        cluster.chown(self.out)
        self.dir = cluster.workdir
        self.spec = cluster.write(self.dir / "campaign.yaml", yaml.safe_dump(data, sort_keys=False))
        self.plan = self.dir / "plan"

    def hp(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.cluster.run_as_user([self.hpcrun, *args], cwd=str(self.dir), timeout=timeout,
                                        env={"COLUMNS": "200"})

    def plan_and_submit(self) -> list:
        proc = self.hp("plan", str(self.spec), "--out", str(self.plan))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = self.hp("submit", str(self.plan), "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)["submitted"]

    def status(self, wait: bool = True, timeout: float = 240) -> list:
        wait_args = ["--wait", "--timeout", str(timeout), "--interval", "2"]   # local-test allows 1 s
        args = ["status", str(self.plan), "--json", "--all"] + (wait_args if wait else [])
        proc = self.hp(*args, timeout=timeout + 60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)["jobs"]

    def node(self, row: dict) -> str:
        """The node a one-node job ran on, as accounting says: the cluster is shared by the tests of both
        xdist workers, so the first node may have been busy and the job placed on another."""
        nodes = self.cluster.sacct(row["slurm_id"], fields="NodeList")[0]["NodeList"]
        assert nodes in self.cluster.nodes, f"job {row['slurm_id']} ran on {nodes!r}, not one node"
        return nodes

    def rundir(self, row: dict) -> Path:
        raw = self.cluster.sacct(row["slurm_id"], fields="JobIDRaw")[0]["JobIDRaw"]
        return run_record(self.plan, raw, row["job"])




def run_record(plan: Path, run_id: str, job: str | None = None) -> Path:
    """A run's directory as the job left it, or, when the supervisor folded it after its success, a copy of it
    read back from its segment into ``unfolded/`` (what `tar -x` of the segment gives)."""
    here = next((plan / "run").glob(f"{job or '*'}/{run_id}"), None)
    if here is not None and here.is_dir():
        return here
    found = [r for r in folding.indexed(str(plan / "run")) if r.run_id == run_id and job in (None, r.job)]
    assert found, f"run {run_id} of {job or 'any job'} is neither in run/ nor folded"
    out = plan / "unfolded" / found[-1].job / run_id
    for rel, data in folding.read_run(found[-1]).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_jobs(plan: Path) -> dict[str, str]:
    """Every run's id -> its job's name, whether the run kept its directory or was folded."""
    out = {r.run_id: r.job for r in folding.indexed(str(plan / "run"))}
    out.update((d.name, d.parent.name) for d in (plan / "run").glob("*/*") if d.is_dir() and d.parent.name not in (
        "pilots", "finalize", folding.FOLDED))
    return out


def claim_log(plan: Path, cid: str) -> str:
    """What the claim's run of the job script said: its section of its slot's log."""
    from hpcrun.operate.outputs.runlogs import claim_log as section
    return section(plan, cid)[1]


def footprint(c: Campaign, inputs: int) -> dict:
    """What the campaign left on the shared filesystem (issue 56): entries (files and directories) under the
    plan directory and under the outputs location, per input, and the plan's forecast of them."""
    counted = {name: sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))
               for name, root in (("plan", c.plan), ("outputs", c.out))}
    head = json.loads((c.plan / "manifest.json").read_text())
    return {"entries": counted, "entries_per_input": round(sum(counted.values()) / inputs, 3),
            "forecast": head.get("footprint")}


def run_files(plan: Path, pattern: str) -> list:
    """The text of every run record matching ``pattern`` under run/ (e.g. ``*/*/transfers.tsv``): in the runs'
    directories, and folded (a run in both read once, from its directory)."""
    here = {f.relative_to(plan / "run").as_posix(): f.read_text() for f in (plan / "run").glob(pattern)}
    kept = {tuple(name.split("/")[:2]) for name in here}
    folded = [data.decode() for name, data in folding.matching(str(plan / "run"), pattern)
              if tuple(name.split("/")[:2]) not in kept]
    return list(here.values()) + folded


def queue_results(plan: Path) -> list:
    """Every committed result of a late-bound campaign, in ``queue/done/`` or folded into a ledger once recorded:
    one row per (task, claim), so that a task committed by two claims shows twice."""
    rows = {}
    for r in ledger.Ledgers(plan / "queue").lines():
        rows[(r[0], r[1])] = r
    done = plan / "queue" / "done"
    for p in (done.iterdir() if done.exists() else ()):
        r = p.read_text().rstrip("\n").split("\t")
        rows[(r[0], r[1])] = r
    return list(rows.values())
