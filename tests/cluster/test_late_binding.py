"""Late binding on the real test cluster: pilots claim the inputs from the queue on the shared filesystem.

The short-input campaign is the issue's own (200 one-CPU inputs of 3 s; benchmarks/late_binding.py runs
it beside array mode). The fault campaign (a benchmark: benchmarks/late_binding.py --cases faults): its
inputs come from an XRootD origin through the nodes' caches, a second generation (another release) is
planned under way, root cancels a running pilot, a node dies under one, one reaches its walltime
mid-input, and the supervisor is SIGKILLed twice; every input is done once, under the right generation.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpcrun.backends.late.runs import CLAIM_HEADER

from .campaigns import Campaign, claim_log, footprint, queue_results, run_jobs, run_record
from .test_scheduler_rpcs import _read, _reset, split

pytestmark = pytest.mark.cluster


def _raw(cluster, name: str, n: int) -> Path:
    raw = cluster.pfs / f"late-raw-{name}-{n}"
    raw.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (raw / f"r{i:05d}.dat").write_bytes(b"x" * 256)
    cluster.chown(raw)
    return raw


# each run of an input appends '<input> <claim id>' to a ledger hpcrun never writes, and its output ends with the
# claim id: "once" is counted there (_done_once), not from the queue's or the store's records
LEDGERED = ('t=$0; [ "$t" != input ] || read -r t < "$1"; sleep "$t"; cp "$1" "$2" '
            '&& printf "\\n%s\\n" "$HPCRUN_JOB_ID" >> "$2" && printf "%s %s\\n" "$1" "$HPCRUN_JOB_ID" >> "$3"')


def ledger(cluster, name: str) -> Path:
    path = cluster.pfs / f"late-ledger-{name}"
    path.unlink(missing_ok=True)
    cluster.write(path, "")
    cluster.chown(path)
    return path


def late_campaign(cluster, hpcrun_bin, root, name: str, n: int, work: str, pilot: dict, **changes) -> Campaign:
    raw = _raw(cluster, name, n)
    book = ledger(cluster, name)
    spec = dict(burst_buffer=None, database=None, merge=None, qa=None,
                inputs={"glob": str(raw / "*.dat"), "checksum": "none"}, walltime="00:02:00",
                jobs={"files_per_job": 1, "chains_per_node": 1, "binding": "late", "pilot": pilot},
                chain={"command": ["/bin/sh", "-c", LEDGERED, work, "{input}", "{output}", str(book)]},
                outputs={"location": "", "pattern": "{stem}.out"})
    spec.update(changes)
    c = Campaign(cluster, hpcrun_bin, root, name, **spec)
    c.ledger = book   # the chain's own (a chain given in changes writes the ledger of this name, or none)
    _fresh(c)
    cluster.chown(cluster.workdir)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return c


def _read_or_empty(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _fresh(c: Campaign) -> None:
    """A new plan directory and output location (a rerun of the test would plan a next generation)."""
    shutil.rmtree(c.plan, ignore_errors=True)
    for p in c.out.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _pilots_gone(cluster, name: str, timeout: float = 120) -> None:
    """Every pilot ended (they stop at the campaign's end, by themselves)."""
    cluster.wait_until(lambda: not cluster.run(["squeue", "-h", "-n", name, "-o", "%A"]).stdout.strip(),
                       timeout=timeout, interval=1, what=f"pilots {name} gone")


def _done_once(c: Campaign, n: int, exact: bool = True) -> dict:
    """Every input done exactly once: one output each, one committed result each, none lost. Counted from the
    inputs' own ledger: every input ran (``exact``: once, no fault campaign), and the output in place of each
    is the one its committed claim made, never replaced after the commit by another run of it."""
    st = json.loads(c.hp("status", str(c.plan), "--json", "--all").stdout)
    states = collections.Counter(j["status"] for j in st["jobs"])
    assert states == {"done": n}, states
    outputs = sorted(c.out.glob("*.out"))
    assert len(outputs) == n, len(outputs)
    assert not list((c.out / ".hpcrun-claims").glob("*/*")), "a claim's outputs were left behind"
    done = queue_results(c.plan)
    completed = collections.Counter(r[0] for r in done if r[8] == "COMPLETED")
    assert len(completed) == n and set(completed.values()) == {1}, completed
    committed = {r[1] for r in done if r[8] == "COMPLETED"}
    runs: dict = collections.defaultdict(list)
    for line in c.ledger.read_text().splitlines():
        src, cid = line.split(" ")
        runs[Path(src).stem].append(cid)
    assert len(runs) == n, f"{len(runs)} inputs ran of {n}"
    if exact:
        assert all(len(v) == 1 for v in runs.values()), {k: v for k, v in runs.items() if len(v) > 1}
    for out in outputs:
        made_by = out.read_text().splitlines()[-1]
        assert made_by in runs[out.stem] and made_by in committed, (out.name, made_by, runs[out.stem])
    assert len({out.read_text().splitlines()[-1] for out in outputs}) == n
    return st



def test_short_inputs_late_bound_end_fast_with_one_sbatch(slurm_cluster, hpcrun_bin, example_root):
    n = int(os.environ.get("HPCRUN_LATE_INPUTS", "200"))
    work = os.environ.get("HPCRUN_LATE_WORK_S", "3")
    cap = os.environ.get("HPCRUN_LATE_MAX_QUEUED")   # the site-limit benchmark: max_queued_jobs
    extra = {"site": {"profile": [{"profile": "local-test", "max_queued_jobs": int(cap)}]}} if cap else {}
    tail = os.environ.get("HPCRUN_LATE_TAIL")   # "10x60": that many inputs of that many seconds, at random places
    if tail:   # an input's own limit (walltime, less the 60 s warning before it) must hold the long ones
        extra["walltime"] = "00:05:00"
    c = late_campaign(slurm_cluster, hpcrun_bin, example_root, f"late{n}", n, "input" if tail else work,
                      {"walltime": "01:00:00", "slots": 8, "idle_release": "20s", "input_time": "10s"}, **extra)
    if tail:   # each input's time is its first line (the chain reads it): the long ones spread at random
        count, long_s = tail.split("x")
        longs = set(random.Random(55).sample(range(n), int(count)))
        for i, path in enumerate(sorted((slurm_cluster.pfs / f"late-raw-late{n}-{n}").glob("*.dat"))):
            path.write_text(f"{long_s if i in longs else work}\n")
    _reset(slurm_cluster)
    t0 = time.time()
    proc = c.hp("run", str(c.plan), "--interval", "5", timeout=float(os.environ.get("HPCRUN_LATE_TIMEOUT", "900")))
    wall = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_type, by_user, _dt, _du = _read(slurm_cluster)
    last = max(p.stat().st_mtime for p in c.out.glob("*.out"))
    results = queue_results(c.plan)
    first = min(float(r[5]) for r in results)
    pilots = {r[2] for r in results}
    total = by_user.get(slurm_cluster.user, 0)
    figures = {"inputs": n, "work_s": float(work), "to_last_output_s": round(last - t0, 1),
               "to_first_claim_s": round(first - t0, 1), "run_wall_s": round(wall, 1),
               "dispatch_per_s": round(n / (max(float(r[6]) for r in results) - first), 1),
               "pilots": len(pilots), "max_queued_jobs": cap, "tail": tail,
               "long_started_s": sorted(round(float(r[5]) - first, 1) for r in results   # after the first claim
                                        if tail and float(r[6]) - float(r[5]) > float(tail.split("x")[1]) / 2),
               "scripts": sum(p.read_text().count(CLAIM_HEADER) for p in (c.plan / "run" / "pilots").glob(
                   "*/claims/*.log")),
               "sbatch": by_type.get("REQUEST_SUBMIT_BATCH_JOB", 0), "controller_user_total": total,
               **split(by_type, total), **footprint(c, n)}
    print("\nlate_binding " + json.dumps(figures), flush=True)
    _done_once(c, n)
    if cap:
        assert len(pilots) <= int(cap), figures
    assert figures["sbatch"] == 1 or n > 1000, figures   # a long campaign's pilots may end and be replaced
    assert total <= 30 or n > 1000, figures
    if n == 200 and float(work) == 3:
        # the goal is 30 s (benchmarks/late_binding.py reports against it on an idle machine); in CI the
        # other tests share the 2 cores, so this bound is looser, and still below a raw array's 42 s floor here
        assert figures["to_last_output_s"] <= 36, figures
    Path(os.environ.get("HPCRUN_LATE_RESULT", os.devnull)).write_text(json.dumps(figures))


def test_short_inputs_are_run_by_the_pilots_python_worker(slurm_cluster, hpcrun_bin, example_root):
    """On Slurm: claims of several no-op inputs are run by the plan's Python worker (jobs.pilot.direct, issue 55),
    not the job script's bash: each program's parent says so, and every input is done once, its output the
    committed claim's."""
    n = 60
    book = ledger(slurm_cluster, "direct")
    chain = ["/bin/sh", "-c", 'cat /proc/$PPID/comm >> "$2.parents"; cp "$0" "$1" && printf "\\n%s\\n" '
             '"$HPCRUN_JOB_ID" >> "$1" && printf "%s %s\\n" "$0" "$HPCRUN_JOB_ID" >> "$2"', "{input}", "{output}",
             str(book)]
    c = late_campaign(slurm_cluster, hpcrun_bin, example_root, "direct", n, "0",
                      {"walltime": "00:10:00", "slots": 8, "nodes": 1, "idle_release": "5s", "input_time": "1s"},
                      chain={"command": chain})
    c.ledger = book
    proc = c.hp("run", str(c.plan), "--interval", "5", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _done_once(c, n)
    parents = collections.Counter(Path(str(book) + ".parents").read_text().split())
    assert sum(parents.values()) == n and parents["python3"] >= n // 2, parents   # claims of one run bash


SLOW_CHAIN = ('m="$0/$(basename "$1").slow"; if [ -e "$m" ]; then rm -f "$m"; sleep 148; else sleep "$3"; fi; '
              'cp "$1" "$2" && printf "\\n%s\\n" "$HPCRUN_JOB_ID" >> "$2" '
              '&& printf "%s %s\\n" "$1" "$HPCRUN_JOB_ID" >> "$4"')


def _input_of(plan: Path, task: str):
    """The input a queue task runs: its submission's script, that script's first job in the manifest, the
    job's row in the task table beside the script (or the plan's)."""
    qid, _, i = task.rpartition("_")
    script = _read_or_empty(plan / "queue" / "arrays" / qid).split("\t")[0]
    scripts = json.loads((plan / "manifest.json").read_text())["scripts"]
    entry = next((s for s in scripts if script and s.get("path") == os.path.relpath(script, plan)), None)
    if entry is None:
        return None
    job = str(entry["jobs"][0] + int(i))
    for tasks in (Path(script).parent.parent / "tasks.tsv", plan / "tasks.tsv"):
        for line in _read_or_empty(tasks).splitlines():
            fields = line.split("\t")
            if fields[0] == job:
                return fields[3]
    return None


def _pilots_running(cluster, name: str) -> list:
    """(raw job id, node, array task id) of each running pilot: a pilot's directory is named by the first,
    scancel takes the last (Slurm 22.05 calls an array task's raw id an invalid job id)."""
    out = cluster.run(["squeue", "-h", "-t", "RUNNING", "-n", name, "-o", "%A|%N|%i"]).stdout.split()
    return [tuple(line.split("|")) for line in out]


def _cached_inputs(cluster, origin, n: int) -> dict:
    """``n`` inputs served by the XRootD origin, read through a cache on each node (a profile of its own)."""
    work = cluster.workdir
    urls = [origin.put(f"store/latefaults/r{i:05d}.dat", b"x" * 256) for i in range(n)]
    cluster.write(work / "inputs.txt", "".join(f"{u} 256 10\n" for u in urls))
    caches = work / "caches"
    caches.mkdir(mode=0o1777, exist_ok=True)
    caches.chmod(0o1777)
    cluster.write(work / "cached.yaml", yaml.safe_dump({
        "name": "late-cached", "extends": "local-test",
        "xrootd": {"node_cache": {"path": str(caches / "{node}"), "max_size": "1GB", "index": str(work / "index")}}}))
    return {"inputs": {"list_file": str(work / "inputs.txt"), "checksum": "none"},
            "site": {"profile": str(work / "cached.yaml")}}


@pytest.mark.skipif(not os.environ.get("HPCRUN_LATE_FAULTS"), reason=(
    "a long fault campaign (about 7 minutes): a benchmark, run by benchmarks/late_binding.py --cases faults"))
def test_pilots_survive_a_cancel_a_node_crash_a_walltime_and_two_supervisor_kills(slurm_cluster, hpcrun_bin,
                                                                                   example_root, xrootd_origin):
    """Root cancels a running pilot, a node dies under another, one reaches its walltime mid-input, the
    supervisor is SIGKILLed twice and a second generation (another release) is planned under way: every
    input is done exactly once, under the generation of its job, none lost, no attempt charged for it."""
    from .faults import FaultCampaign, Faults
    n = int(os.environ.get("HPCRUN_LATE_FAULT_INPUTS", "200"))
    markers = slurm_cluster.workdir / "late-markers"
    markers.mkdir(parents=True, exist_ok=True)
    slurm_cluster.chown(markers)
    c = late_campaign(slurm_cluster, hpcrun_bin, example_root, "latefaults", n, "6",
                      # Slurm keeps time limits in whole minutes and ends a job at a periodic check, up to 30 s
                      # after its limit (pilots of 3:40 ended at 248 s; one ran to 263 s, where an input of 128 s
                      # claimed at 135 s ended first). A 4:00 pilot ends at 240-270 s: an input of 148 s claimed after
                      # 134 s or more of it outlives it whenever the check comes; its own limit (210 s, signalled
                      # 60 s before) does not end it first; Slurm's drain signal (at 210 s) may come up to 60 s early
                      # (at 150 s): the input is marked while every pilot is 134-140 s old
                      {"walltime": "00:04:00", "slots": 2, "idle_release": "20s", "input_time": "10s",
                       "lease": "30s", "drain_margin": "30s"}, walltime="00:03:30",
                      chain={"command": ["/bin/sh", "-c", SLOW_CHAIN, str(markers), "{input}", "{output}", "6",
                                         str(ledger(slurm_cluster, "latefaults"))]},
                      software={"release": "late-1"}, **_cached_inputs(slurm_cluster, xrootd_origin, n))
    regenerated = False
    name = f"{c.name}.pilot"
    log: list = []
    t0 = time.monotonic()

    def start():
        return subprocess.Popen([hpcrun_bin, "run", str(c.plan), "--interval", "5"], cwd=str(c.dir),
                                env=dict(slurm_cluster.user_env, COLUMNS="200"), user=slurm_cluster.uid,
                                group=slurm_cluster.gid, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def now() -> str:
        return f"{time.monotonic() - t0:5.1f}s"

    sup = start()
    kills, cancelled, crashed, slowed, crashed_node = 0, None, None, None, ""
    crasher = FaultCampaign.__new__(FaultCampaign)   # only its node crash is used
    crasher.cluster, crasher.faults = slurm_cluster, Faults(files=0, once=0, hopeless=0, slow=0, corrupt=0)
    deadline = time.monotonic() + 900
    while sup.poll() is None or kills < 2:
        assert time.monotonic() < deadline, log
        age = time.monotonic() - t0
        running = _pilots_running(slurm_cluster, name)
        if kills < 2 and age > (12 if kills == 0 else 40) and sup.poll() is None:
            sup.kill()
            sup.wait()
            kills += 1
            log.append(f"{now()} supervisor SIGKILLed ({kills})")
            sup = start()
        if cancelled is None and len(running) >= 3 and age > 8:
            cancelled = running[0][0]
            proc = slurm_cluster.run(["scancel", running[0][2]])
            assert proc.returncode == 0, proc.stderr
            log.append(f"{now()} root cancelled pilot {cancelled} on {running[0][1]}")
        if crashed is None and cancelled and age > 20 and running:
            on_node = collections.Counter(node for _j, node, _t in running)
            node = min(on_node, key=lambda k: on_node[k])    # the node with the fewest pilots
            victims = [j for j, nd, _t in running if nd == node]
            crasher._crash_node(node, victims)
            crashed, crashed_node = victims, node
            log.append(f"{now()} crashed {node} under pilot(s) {', '.join(victims)}")
        ages = [time.time() - float(_read_or_empty(p / "info").split("\t")[2] or time.time())
                for p in (c.plan / "queue" / "live").iterdir()] if (c.plan / "queue" / "live").exists() else []
        if not regenerated and crashed and age > 35:   # a new release, taken up at the pilots' next claims
            data = yaml.safe_load(c.spec.read_text())
            data["software"]["release"] = "late-2"
            slurm_cluster.write(c.spec, yaml.safe_dump(data, sort_keys=False))
            applied = c.hp("plan", str(c.spec), "--out", str(c.plan), "--apply")
            assert applied.returncode == 0 and "generation 2" in applied.stdout, applied.stdout + applied.stderr
            regenerated = True
            log.append(f"{now()} generation 2 planned (release late-2)")
        # ... and no pilot about to start (pending, or running without its directory yet), which would be younger
        # and claim the marked input first (it is in ready/), with walltime enough to end it
        steady = slowed is None and ages and len(ages) == len(running) and not slurm_cluster.run(
            ["squeue", "-h", "-t", "PENDING,CONFIGURING", "-n", name, "-o", "%A"]).stdout.split()
        if steady and crashed and 134 <= min(ages) and max(ages) <= 140:
            from hpcrun.backends.late.queue import Queue
            q = Queue(c.plan / "queue")
            waiting = sorted(f"{qid}_{i}" for qid, idx in q.waiting().items() for i in idx)
            # a waiting input that will outlast the pilot that claims it, whichever it is: one hinted to a node
            # whose (old) pilot takes its hints first, or one nobody's hint, taken out of its chunk into ready/
            # (as a hint is), which a pilot claims before any chunk
            nodes = {_read_or_empty(d / "info").split("\t")[0].split(".")[0] for d in q.d("live").iterdir()}
            hinted = {t.name: n.name for n in q.d("near").iterdir() for t in n.iterdir()} \
                if q.d("near").is_dir() else {}
            pick = [t for t in waiting if hinted.get(t) in nodes] or [t for t in waiting if t not in hinted]
            source = _input_of(c.plan, pick[0]) if pick else None
            if source:   # marked first, then put where the next claim takes it
                slurm_cluster.write(markers / f"{os.path.basename(source)}.slow", "once\n")
                got = [pick[0]] if (q.d("ready") / pick[0]).exists() else sorted(q.extract(pick[:1], "ready"))
                for made in (q.d("ready"), q.root / ".hold"):   # made as root here: the test user's again
                    if made.exists():
                        slurm_cluster.chown(made)
                slowed = got[0] if got else None
                if slowed:
                    log.append(f"{now()} input {slowed} ({os.path.basename(source)}) made to outlast its pilot's "
                               "walltime")
                else:
                    (markers / f"{os.path.basename(source)}.slow").unlink(missing_ok=True)
        time.sleep(1)
    out = sup.stdout.read()
    log.append(f"{now()} supervisor ended {sup.returncode}")
    if crashed:
        slurm_cluster.restart_slurmd(crashed_node)
    assert sup.returncode == 0, out[-3000:] + "\n".join(log)
    st = _done_once(c, n, exact=False)   # a fenced claim's run is in the ledger too; its output never placed
    assert all(j["attempts"] == 1 for j in st["jobs"]), [j for j in st["jobs"] if j["attempts"] != 1]
    assert regenerated, log
    releases = collections.Counter()
    jobs = run_jobs(c.plan)
    for r in queue_results(c.plan):   # each input under its own job's generation
        task, cid, pilot = r[:3]
        job = jobs[cid]
        said = claim_log(c.plan, cid)
        release = said.split(", release ", 1)[1].split(",", 1)[0]
        assert release == ("late-2" if int(job.rsplit(".", 1)[1]) > n else "late-1"), (task, job, release)
        releases[release] += 1
    cached = sum(len(f.read_text().splitlines()) for f in (slurm_cluster.workdir / "index").iterdir())
    log.append(f"inputs by release: {dict(releases)}; the nodes' caches list {cached} input(s)")
    assert set(releases) == {"late-1", "late-2"} and cached >= n // 2, log
    ended = {p.name for p in (c.plan / "queue" / "ended").iterdir()}
    print("\n" + "\n".join(log) + f"\nfenced pilots: {sorted(ended)}", flush=True)
    assert cancelled and crashed, log
    # the cancelled pilot and the crashed one were fenced (their claims returned), so was the one whose
    # walltime ended mid-input
    assert cancelled in ended and set(crashed) <= ended, (ended, log)
    assert slowed, log
    outlived = [p for p in ended if slowed in _read_or_empty(c.plan / "queue" / "ended" / p / "returned")]
    assert outlived, ("the slow input's first pilot was not fenced with it", ended, log)
    states = {line.split("\t")[0]: line.split("\t")[1]
              for line in (c.plan / "queue" / "pilots.tsv").read_text().splitlines()}
    # the slow input may have been returned before (by the cancelled or the crashed pilot): one of the pilots
    # that gave it back is the one whose walltime ended under it
    assert states[cancelled] == "CANCELLED" and any(states.get(p) == "TIMEOUT" for p in outlived), \
        (states, outlived, log)


@pytest.mark.postgres
def test_a_late_bound_reconstruction_copies_the_payload_once_per_pilot(slurm_cluster, hpcrun_bin, example_root,
                                                                       pg_server):
    """The example campaign (database, chains, merge, QA) bound late, its state in PostgreSQL: each pilot copies
    the payload and starts its server once for every input it runs; a failed chain fails its input with the
    array mode's exit code and class, and the retry runs in a pilot too. The nodes never reach the store: the
    queue on the shared filesystem is the pilots' only meeting point, whatever the store. The burst buffer is the
    example's (the DataWarp emulation): each pilot's one #DW jobdw serves the inputs it runs, which copy
    themselves in and out of it, summed (the array-mode twin: test_e2e.py's stage-in and stage-out)."""
    from tests import pg
    db = ("--db", pg.fresh_database(pg_server))
    from .test_campaign_state import make_raw
    n = 8
    glob = make_raw(slurm_cluster, example_root, slurm_cluster.pfs / "late-db-raw", n)
    markers = slurm_cluster.workdir / "late-db-markers"
    markers.mkdir(parents=True, exist_ok=True)
    slurm_cluster.chown(markers)
    first = sorted(Path(glob).parent.glob("*.h5"))[0].name
    slurm_cluster.write(markers / f"{first}.fail", "once\n")
    c = Campaign(slurm_cluster, hpcrun_bin, example_root, "latedb", inputs__glob=glob,
                 chain_extra=["--fail-marked", str(markers)],
                 jobs={"files_per_job": 1, "chains_per_node": 2, "binding": "late",
                       "pilot": {"walltime": "00:15:00", "nodes": 2, "idle_release": "15s"}})
    _fresh(c)
    proc = c.hp("plan", str(c.spec), "--out", str(c.plan), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["pilots"]["slots"] == 4
    proc = c.hp("run", str(c.plan), *db, "--interval", "3", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    st = json.loads(c.hp("status", str(c.plan), *db, "--json", "--all").stdout)
    assert st["pilots"] is not None and st["pilots"]["done"] == n + 1, st["pilots"]
    assert collections.Counter(j["status"] for j in st["jobs"]) == {"done": n}, st["jobs"]
    assert len(list(c.out.glob("*.reco.h5"))) == n
    failed = [r for r in queue_results(c.plan) if r[8] == "FAILED"]
    assert len(failed) == 1 and failed[0][7] == "7", failed
    _failed_kept_and_done_folded(c, db, first, failed[0][1])
    _pilots_gone(slurm_cluster, f"{c.name}.pilot")
    report = json.loads(c.hp("report", str(c.plan), *db, "--json").stdout)
    assert report["attempts_by_class"] == {"chain": 1}, report["attempts_by_class"]
    pilots = sorted((c.plan / "run" / "pilots").iterdir())
    assert 1 <= len(pilots) <= 2, pilots
    for p in pilots:   # one copy of the payload and one server for every input the pilot ran
        assert (p / "payload-copies").read_text().strip() == "1"
        assert len(list((p / "db").glob("*.ready"))) == 1
        assert (p / "db" / f"{(p / 'pilot.tsv').read_text().split()[0]}.stopped").read_text().strip() == "0"
    claims = [run_record(c.plan, cid, job) for cid, job in run_jobs(c.plan).items() if job.startswith("e2e-latedb.")]
    assert len(claims) == n + 1
    assert all("using the pilot's database server" in claim_log(c.plan, r.name) for r in claims)
    assert all((r / "qa.tsv").read_text().split()[3] == "pass" for r in claims if (r / "qa.tsv").exists())
    assert report["pilots"]["payload_copies"] == len(pilots), report["pilots"]
    _buffers_served_the_claims(slurm_cluster, c, pilots, claims, n)
    assert report["pilots"]["inputs_run"] == n + 1, report["pilots"]
    # the pilots' own CPU time, read from the accounting once they ended (after the supervisor's last round)
    assert report["pilots"]["pilots_cpu_s"] > 0 and report["pilots"]["input_cpu_s"] > 0, report["pilots"]


def _failed_kept_and_done_folded(c: Campaign, db: tuple, name: str, failed_cid: str) -> None:
    """Issue 56: the failed claim's run directory is the only one left, whole; the input's successful run was
    folded; `hpcrun logs` (by the input's file name) shows both, and the pilot's log of each claim."""
    left = [d for d in (c.plan / "run").glob("e2e-latedb.*/*")]
    assert [d.name for d in left] == [failed_cid], left
    proc = c.hp("logs", str(c.plan), name, *db, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (entry,) = json.loads(proc.stdout)
    runs = {r["run_id"]: r for r in entry["runs"]}
    assert entry["state"] == "done" and len(runs) == 2 and not runs[failed_cid]["folded"], runs.keys()
    assert "chain(s) failed" in runs[failed_cid]["files"]["reason"], runs[failed_cid]["files"]
    (ok,) = [r for r in runs.values() if r["folded"]]
    assert {"chains/0.log", "chains/1.log", "chains.tsv", "qa.tsv", "outputs.tsv"} <= set(ok["files"]), ok["files"]
    said = [s["text"] for s in entry["scheduler_logs"]]
    assert len(said) == 2 and all("using the pilot's database server" in t for t in said), said
    text = c.hp("logs", str(c.plan), name, *db, "--file", "chains.tsv").stdout
    assert text.count("==> chains.tsv of run ") == 2 and f"run {ok['run_id']} (folded, " in text, text


def _buffers_served_the_claims(cluster, c: Campaign, pilots: list, claims: list, n: int) -> None:
    """Each pilot's own buffer (the emulator's events: set up before it ran, torn down after), no stage lines in
    any script; every claim copied its input in and its outputs out of its share of the buffer, summed."""
    for p in pilots:
        cluster.wait_until(lambda j=p.name: "teardown" in [e["function"] for e in cluster.bb_events(j)],
                           timeout=60, what=f"teardown of pilot {p.name}'s buffer")
        funcs = [e["function"] for e in cluster.bb_events(p.name)]
        assert funcs.index("setup") < funcs.index("pre_run") < funcs.index("post_run") < funcs.index("teardown"), funcs
        assert not (cluster.bb_job_dir / p.name).exists(), "the pilot's burst buffer was not torn down"
    assert [ln for ln in (c.plan / "bin" / "hpcrun-pilot.sh").read_text().splitlines()
            if ln.startswith("#DW")][0].startswith("#DW jobdw capacity=")
    copied = {"in": 0, "out": 0}
    for r in claims:
        tsv = r / "copies.tsv"
        for row in [ln.split("\t") for ln in tsv.read_text().splitlines()] if tsv.exists() else []:
            copied[row[0]] += 1
            in_buffer = row[2] if row[0] == "in" else row[1]
            assert re.fullmatch(r"(adler32|sha256|md5):[0-9a-f]+", row[4]) and "/claims/" in in_buffer, row
    # every input was copied in once per claim; every good output was copied out (the failed chain's claim has none)
    assert copied["in"] == n + 1 and copied["out"] >= n, copied


ROUNDS = '''
import json, resource, sys, time
from hpcrun.operate.supervision import supervise
out, state = sys.argv[2], {"last": None, "slept": 0.0, "rounds": [], "started": time.monotonic(), "first": None,
                           "cpu": [], "cpu_at": 0.0, "ticked": 0.0, "ticked_cpu": 0.0, "ticks": 0,
                           "tick_max": 0.0, "tick_cpu_max": 0.0}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def sleep(s):
    t0 = time.monotonic(); time.sleep(s); state["slept"] += time.monotonic() - t0
real_between = supervise.Supervisor.between_rounds
def between(self):   # the queue read between two rounds: timed on its own, not counted in the rounds
    t0, c0 = time.monotonic(), cpu()
    real_between(self)
    took, took_cpu = time.monotonic() - t0, cpu() - c0
    state["ticked"] += took; state["ticked_cpu"] += took_cpu; state["ticks"] += 1
    state["tick_max"] = max(state["tick_max"], took); state["tick_cpu_max"] = max(state["tick_cpu_max"], took_cpu)
    if state["ticks"] % 5 == 0:
        dump()
supervise.Supervisor.between_rounds = between
def dump():
    with open(out + ".tmp", "w") as f:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        json.dump({"rounds_s": state["rounds"], "maxrss_mb": rss, "first_round_s": state["first"],
                   "rounds_cpu_s": state["cpu"], "ticks": state["ticks"], "tick_s_max": round(state["tick_max"], 3),
                   "tick_cpu_s_max": round(state["tick_cpu_max"], 3)}, f)
    import os; os.replace(out + ".tmp", out)
def on_round(rnd):
    now = time.monotonic()
    if state["last"] is not None:   # wall time (the nodes' jobs share these 2 cores) and the round's own CPU time
        state["rounds"].append(round(now - state["last"] - state["slept"] - state["ticked"], 3))
        state["cpu"].append(round(cpu() - state["cpu_at"] - state["ticked_cpu"], 3))
    else:   # the first: registering and submitting every input
        state["first"] = round(now - state["started"], 1)
    state["cpu_at"] = cpu()
    state["last"], state["slept"], state["ticked"], state["ticked_cpu"] = now, 0.0, 0.0, 0.0
    dump()
supervise.run(sys.argv[1], interval=float(sys.argv[3]) if len(sys.argv) > 3 else None, on_round=on_round, sleep=sleep)
'''


def _rounds_seen(path: Path) -> int:
    """Rounds the supervisor measured after its first (its figures file, written as it goes)."""
    try:
        return len(json.loads(path.read_text())["rounds_s"])
    except (OSError, ValueError, KeyError):
        return 0


def _listed_sizes(queue: Path) -> dict:
    """Entries of every directory a pilot or the supervisor lists (``done/`` is looked up by name only)."""
    sizes = {d: len(os.listdir(queue / d)) for d in ("backlog", "ready", "live", "fenced", "cancel", "results",
                                                      "arrays") if (queue / d).is_dir()}
    for parent in ("live", "near"):
        for sub in (queue / parent).iterdir() if (queue / parent).is_dir() else ():
            sizes[f"{parent}/{sub.name}"] = len(os.listdir(sub))
    return sizes


@pytest.mark.skipif(not os.environ.get("HPCRUN_LATE_SCALE"), reason=(
    "a benchmark (minutes at 10^5 and 10^6 inputs): benchmarks/late_binding.py --cases scale"))
def test_late_binding_at_scale(slurm_cluster, hpcrun_bin, example_root):
    """No-op inputs for a fixed window: outputs per second, metadata operations per input, the largest directory
    listed, and the supervisor's round time and memory, with the whole campaign pending in the queue."""
    n = int(os.environ["HPCRUN_LATE_SCALE"])
    window = float(os.environ.get("HPCRUN_LATE_WINDOW", "120"))
    t_plan = time.time()
    c = late_campaign(slurm_cluster, hpcrun_bin, example_root, f"scale{n}", n, "0",
                      {"walltime": "01:00:00", "slots": 8, "idle_release": "60s", "input_time": "10s"},
                      chain={"command": ["/bin/cp", "{input}", "{output}"]})
    planned_s = time.time() - t_plan
    figures_path = slurm_cluster.workdir / f"scale{n}-rounds.json"
    script = slurm_cluster.write(slurm_cluster.workdir / "rounds.py", ROUNDS)
    python = str(Path(hpcrun_bin).parent / "python3")
    env = dict(slurm_cluster.user_env, COLUMNS="200")
    t0 = time.time()
    # the supervisor polls at the site's interval (once a minute here) unless HPCRUN_LATE_INTERVAL says otherwise
    interval = [os.environ["HPCRUN_LATE_INTERVAL"]] if os.environ.get("HPCRUN_LATE_INTERVAL") else []
    sup = subprocess.Popen([python, str(script), str(c.plan), str(figures_path), *interval], cwd=str(c.dir), env=env,
                           user=slurm_cluster.uid, group=slurm_cluster.gid, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    queue = c.plan / "queue"
    biggest: dict = {}
    try:
        first = None
        deadline = time.time() + 1200
        while time.time() < deadline and sup.poll() is None:
            time.sleep(5)
            for k, v in _listed_sizes(queue).items():
                biggest[k] = max(biggest.get(k, 0), v)
            if first is None and any((queue / "results").glob("*")):
                first = time.time()
            # the window over, and the supervisor's rounds measured: at least four after its first (at 10^6 the
            # first, which enqueues every input, may outlast the window)
            if first is not None and time.time() - first >= window + 20 and _rounds_seen(figures_path) >= 4:
                break
    finally:
        sup.terminate()
        try:
            out = sup.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:   # deaf to TERM mid-round (a store transaction): killed
            sup.kill()
            out = sup.communicate()[0]
        slurm_cluster.run(["scancel", "-n", f"{c.name}.pilot"])
        _pilots_gone(slurm_cluster, f"{c.name}.pilot", timeout=180)
    assert first is not None, "no input was committed; the supervisor said:\n" + out[-3000:]
    ends = []
    for fields in queue_results(queue.parent):
        if len(fields) > 8 and fields[8] == "COMPLETED":
            ends.append(float(fields[6]))
    ends.sort()
    # the steady rate: the pilots' start behind (20 s, or a fifth of a run shorter than the window), and its
    # tail (a run that ended within the window: its last tenth)
    span = ends[-1] - ends[0]
    w0 = ends[0] + min(20.0, span / 5)
    window = min(window, ends[-1] - span / 10 - w0) if span < window + 20 else window
    in_window = [e for e in ends if w0 <= e < w0 + window]
    agents = [line.split("\t") for p in (c.plan / "run" / "pilots").glob("*/agent.tsv")
              for line in p.read_text().splitlines()]
    claims, ops = sum(int(a[0]) for a in agents), sum(int(a[1]) for a in agents)
    rounds = json.loads(figures_path.read_text()) if figures_path.exists() else {"rounds_s": [], "maxrss_mb": None}
    steady = rounds["rounds_s"][2:] or rounds["rounds_s"]
    figures = {"inputs": n, "planned_s": round(planned_s, 1), "window_s": round(window, 1),
               "to_first_output_s": round(ends[0] - t0, 1), "outputs_per_s": round(len(in_window) / window, 2),
               "metadata_ops_per_input": round(ops / claims, 1) if claims else None, "claims": claims,
               "largest_listed_dir": max(biggest.values()) if biggest else 0,
               "largest_listed": max(biggest, key=biggest.get) if biggest else "",
               "round_s_max": max(steady) if steady else None, "rounds": len(rounds["rounds_s"]),
               "first_round_s": rounds.get("first_round_s"),
               "round_cpu_s_max": max(rounds.get("rounds_cpu_s") or [0]) or None,
               "rounds_s_all": rounds["rounds_s"], "rounds_cpu_s": rounds.get("rounds_cpu_s"),
               "ticks": rounds.get("ticks"), "tick_s_max": rounds.get("tick_s_max"),
               "tick_cpu_s_max": rounds.get("tick_cpu_s_max"),
               "supervisor_maxrss_mb": rounds["maxrss_mb"], "interval_s": interval[0] if interval else "default"}
    print("\nlate_scale " + json.dumps(figures), flush=True)
    Path(os.environ.get("HPCRUN_LATE_RESULT", os.devnull)).write_text(json.dumps(figures))
    assert len(in_window) > 0, out[-3000:]
