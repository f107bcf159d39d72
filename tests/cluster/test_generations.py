"""A campaign changed under way (issue 38), on the real Slurm 22.05 of the test cluster, with its state in
SQLite and in PostgreSQL.

One `hpcrun run`, never restarted, drives 12 inputs; after a third are done, the release and the
walltime change and 4 inputs are added: `hpcrun plan --apply` makes generation 2 and the supervisor
takes it up at its next round. Every input must end done exactly once (sacct), the done ones not run
again, the later jobs must have run the new release (their own log, and the time limit Slurm gave
them) and `hpcrun outputs --json` must list every output with the file's checksum. With
``--reprocess all`` every input runs once more, into the new output location, the old outputs
untouched.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import shutil
import subprocess
import time
import zlib
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from hpcrun.operate.outputs import folding
from tests import pg

from .campaigns import Campaign, claim_log, queue_results, run_jobs, run_record, supervising
from .test_campaign_state import make_raw

pytestmark = pytest.mark.cluster


def _campaign(cluster, hpcrun_bin, example_root, name: str, files: list, linger: float, throttle: int) -> Campaign:
    """The example on these inputs, ``throttle`` jobs at a time (the change must find work left to do)."""
    c = Campaign(cluster, hpcrun_bin, example_root, name, burst_buffer=None, inputs={"files": files},
                 chain_extra=["--linger", str(linger)],
                 jobs={"files_per_job": 1, "chains_per_node": 2, "throttle": throttle},
                 software={"release": "reco-1.0"}, walltime="00:05:00")
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return c


def _inputs(cluster, example_root, name: str, n: int) -> list:
    glob = make_raw(cluster, example_root, cluster.pfs / f"raw-{name}", n, events=200)
    return sorted(str(p) for p in Path(glob).parent.glob("*.h5"))[:n]


def _db(url) -> tuple:
    return ("--db", url) if url else ()


def _supervisor(c: Campaign, url) -> subprocess.Popen:
    argv = [c.hpcrun, "run", str(c.plan), *_db(url), "--interval", "2", "--json"]
    return subprocess.Popen(argv, cwd=str(c.dir), env=dict(c.cluster.user_env, COLUMNS="200"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            user=c.cluster.uid, group=c.cluster.gid)


@contextlib.contextmanager
def _supervising(c: Campaign, url) -> Iterator[subprocess.Popen]:
    """`hpcrun run` while the block changes the campaign under way; it must then end by itself, finished."""
    with supervising(_supervisor(c, url), 900) as sup:
        yield sup
    assert json.loads(sup.stdout_text)["outcome"] == "finished"   # type: ignore[attr-defined]


def _status(c: Campaign, url) -> dict:
    proc = c.hp("status", str(c.plan), *_db(url), "--json", "--all")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _edit(c: Campaign, **changes) -> None:
    data = yaml.safe_load(c.spec.read_text())
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    c.cluster.write(c.spec, yaml.safe_dump(data, sort_keys=False))


def _runs(c: Campaign, since: str) -> list:
    """Every run of the campaign's jobs as sacct lists them (id, state, time limit), with the plan job
    it ran (the run record the job wrote on the node: run/<plan job>/<raw id>) and the number of it."""
    proc = c.cluster.run(["sacct", "-n", "-P", "-X", "-D", "-u", c.cluster.user, "-S", since,
                          "-o", "JobID,JobIDRaw,JobName,State,Timelimit"])
    runs = []
    jobs = run_jobs(c.plan)
    for line in proc.stdout.splitlines():
        jid, raw, name, state, limit = (line.split("|") + [""] * 5)[:5]
        if not name.startswith(c.name + ".") or name.endswith(".finalize"):
            continue
        job = jobs.get(raw, "?")
        runs.append({"id": jid, "raw": raw, "state": state, "limit": limit, "job": job,
                     "number": int(job.rsplit(".", 1)[1]) if job != "?" else 0})
    return runs


def _release_of(c: Campaign, run: dict) -> str:
    """The release a job says it ran, from its own log (written by the job on the node): in logs/ while it
    failed or runs, folded with its run (scheduler.log) once it succeeded."""
    log = next((c.plan / "logs").glob(f"*-{run['id']}.out"), None)
    if log is None:
        log = run_record(c.plan, run["raw"], run["job"]) / folding.SCHEDULER_LOG
    text = log.read_text()
    return text.split(", release ", 1)[1].split(",", 1)[0]


def _sum(path: Path, like: str = "adler32:") -> str:
    """The file's checksum in the algorithm of ``like`` (algo:value), computed here from its bytes."""
    algo = like.split(":", 1)[0]
    data = path.read_bytes()
    if algo == "adler32":
        return f"adler32:{zlib.adler32(data) & 0xFFFFFFFF:08x}"
    return f"{algo}:{hashlib.new(algo, data).hexdigest()}"


def _outputs(c: Campaign, url) -> list:
    proc = c.hp("outputs", str(c.plan), *_db(url), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_release_walltime_and_inputs_change_under_way(slurm_cluster, hpcrun_bin, example_root, backend, request):
    url = pg.fresh_database(request.getfixturevalue("pg_server")) if backend == "postgres" else None
    files = _inputs(slurm_cluster, example_root, f"gen-{backend}", 16)
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, f"gen-{backend}", files[:12], linger=4, throttle=2)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    with _supervising(c, url):
        slurm_cluster.wait_until(lambda: _status(c, url)["inputs"].get("done", 0) >= 4, timeout=400, interval=3)
        done_before = {j["job"] for j in _status(c, url)["jobs"] if j["status"] == "done"}
        _edit(c, software={"release": "reco-1.1"}, walltime="00:07:00", inputs={"files": files})
        shown = c.hp("plan", str(c.spec), "--out", str(c.plan), *_db(url))
        assert shown.returncode == 0 and "nothing written" in shown.stdout, shown.stdout + shown.stderr
        applied = c.hp("plan", str(c.spec), "--out", str(c.plan), *_db(url), "--apply")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "generation 2" in applied.stdout and "4 added" in applied.stdout, applied.stdout

    runs = _runs(c, since)
    completed = collections.Counter(r["job"] for r in runs if r["state"] == "COMPLETED")
    status = _status(c, url)
    assert status["inputs"] == {**status["inputs"], "done": 16}
    assert len(runs) == sum(completed.values()) == 16, runs                  # each input done exactly once
    assert all(completed[n] == 1 for n in done_before)                        # the done ones not run again
    gen2 = [r for r in runs if r["number"] > 12]                              # generation 2 numbers its jobs on
    assert len(gen2) >= 4
    for r in runs:                                                            # what Slurm ran: the job's own log
        want = ("reco-1.1", "00:07:00") if r["number"] > 12 else ("reco-1.0", "00:05:00")
        assert (_release_of(c, r), r["limit"]) == want, r
    records = _outputs(c, url)
    assert len(records) == 16 and {r["generation"] for r in records} == {1, 2}
    for r in records:
        assert r["checksum"] == _sum(Path(r["output"]), r["checksum"]), r
        assert r["release"] == ("reco-1.1" if r["generation"] == 2 else "reco-1.0")
        assert r["node"] and r["job_id"] and r["exit_code"] == 0 and r["payload_identity"]
    assert [g["number"] for g in status["generations"]] == [1, 2]


def test_reprocess_all_reruns_into_a_new_location(slurm_cluster, hpcrun_bin, example_root):
    files = _inputs(slurm_cluster, example_root, "gen-reprocess", 6)
    c = _campaign(slurm_cluster, hpcrun_bin, example_root, "gen-reprocess", files, linger=1, throttle=6)
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    first = c.hp("run", str(c.plan), "--interval", "2", "--json", timeout=600)
    assert first.returncode == 0 and json.loads(first.stdout)["outcome"] == "finished", first.stderr[-2000:]
    old = {Path(r["output"]): r["checksum"] for r in _outputs(c, None)}
    assert len(old) == 6 and all(_sum(p, s) == s for p, s in old.items())

    refused = c.hp("plan", str(c.spec), "--out", str(c.plan), "--apply", "--reprocess", "all")
    assert refused.returncode == 2 and "never overwritten" in refused.stderr, refused.stdout + refused.stderr
    new_out = c.out.parent / "gen-reprocess-v2"
    new_out.mkdir(exist_ok=True)
    slurm_cluster.chown(new_out)
    _edit(c, outputs={**yaml.safe_load(c.spec.read_text())["outputs"], "location": str(new_out)},
          software={"release": "reco-2.0"})
    applied = c.hp("plan", str(c.spec), "--out", str(c.plan), "--apply", "--reprocess", "all")
    assert applied.returncode == 0 and "6 run again" in applied.stdout, applied.stdout + applied.stderr
    second = c.hp("run", str(c.plan), "--interval", "2", "--json", timeout=600)
    assert second.returncode == 0 and json.loads(second.stdout)["outcome"] == "finished", second.stderr[-2000:]

    runs = _runs(c, since)
    assert len(runs) == 12 and all(r["state"] == "COMPLETED" for r in runs)   # every input once more
    records = _outputs(c, None)
    again = [r for r in records if r["generation"] == 2]
    assert len(again) == 6 and all(Path(r["output"]).parent == new_out for r in again)
    assert all(r["checksum"] == _sum(Path(r["output"]), r["checksum"]) and r["release"] == "reco-2.0" for r in again)
    assert all(_sum(p, s) == s for p, s in old.items())                     # the old outputs untouched


def _claims(c: Campaign) -> list:
    """Every committed claim of a late-bound campaign (the queue's done/ records, written by the pilots),
    with the plan job it ran, its time limit (the queue's descriptor) and the release its own log names."""
    q = c.plan / "queue"
    out = []
    jobs = run_jobs(c.plan)
    for r in sorted(queue_results(c.plan)):
        task, cid, pilot, slot, node, _t0, _t1, rc, state = r[:9]
        limit = int((q / "arrays" / task.split("_")[0]).read_text().split("\t")[1])
        job = jobs[cid]
        log = claim_log(c.plan, cid)
        out.append({"task": task, "claim": cid, "pilot": pilot, "slot": slot, "node": node, "state": state,
                    "rc": rc, "job": job, "number": int(job.rsplit(".", 1)[1]), "limit": limit,
                    "release": log.split(", release ", 1)[1].split(",", 1)[0]})
    return out


def test_late_bound_pilots_take_up_a_new_generation_at_their_next_claim(slurm_cluster, hpcrun_bin, example_root):
    """The late-binding twin: one pilot of 2 slots runs generation 1's inputs, the release and walltime
    change under way, and the same pilot (not restarted) runs generation 2's from its next claim on,
    each input under its own generation's script, release and time limit."""
    files = _inputs(slurm_cluster, example_root, "gen-late", 16)
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "gen-late", burst_buffer=None, inputs={"files": files[:12]},
                 chain_extra=["--linger", "4"], software={"release": "reco-1.0"}, walltime="00:05:00",
                 jobs={"files_per_job": 1, "chains_per_node": 2, "binding": "late",
                       "pilot": {"walltime": "00:20:00", "slots": 2, "nodes": 1}})
    shutil.rmtree(c.plan, ignore_errors=True)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with _supervising(c, None):
        slurm_cluster.wait_until(lambda: _status(c, None)["inputs"].get("done", 0) >= 4, timeout=400, interval=3)
        done_before = {j["job"] for j in _status(c, None)["jobs"] if j["status"] == "done"}
        _edit(c, software={"release": "reco-1.1"}, walltime="00:07:00", inputs={"files": files})
        applied = c.hp("plan", str(c.spec), "--out", str(c.plan), "--apply")
        assert applied.returncode == 0 and "generation 2" in applied.stdout, applied.stdout + applied.stderr
        db = yaml.safe_load(c.spec.read_text())["database"]
        _edit(c, database=dict(db, options=db["options"] + ["--max-connections=50"]))   # a pilot's server: refused
        refused = c.hp("plan", str(c.spec), "--out", str(c.plan), "--apply")
        assert refused.returncode == 2 and "database or container" in refused.stderr, refused.stdout + refused.stderr

    claims = _claims(c)
    assert collections.Counter(r["state"] for r in claims) == {"COMPLETED": 16}, claims
    assert len({r["job"] for r in claims}) == 16                               # each input done exactly once
    assert not done_before & {r["job"] for r in claims if r["number"] > 12}
    for r in claims:                                                           # each under its own generation
        want = ("reco-1.1", 420) if r["number"] > 12 else ("reco-1.0", 300)
        assert (r["release"], r["limit"]) == want, r
    pilots = {r["pilot"] for r in claims}
    both = [p for p in pilots if {r["number"] > 12 for r in claims if r["pilot"] == p} == {True, False}]
    assert both, f"no pilot ran inputs of both generations: {claims}"          # taken up without a restart
    records = _outputs(c, None)
    assert len(records) == 16 and {r["generation"] for r in records} == {1, 2}
    for r in records:
        assert r["checksum"] == _sum(Path(r["output"]), r["checksum"]), r
        assert r["release"] == ("reco-1.1" if r["generation"] == 2 else "reco-1.0")
        assert r["pilot"] in pilots and r["slot"] in ("0", "1") and r["node"].startswith("nid"), r
