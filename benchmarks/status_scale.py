#!/usr/bin/env python3
"""`hpcrun status` on a synthetic campaign of 100k array tasks: one sacct call, and the cost beyond it.

Usage::

    python3 benchmarks/status_scale.py [--tasks 100000] [--json] [--workdir DIR]

No cluster needed. What is built (not timed): a plan of N jobs packed into arrays of 1001
(the shipped ``local-test`` profile, inputs listed with sizes, files that do not exist), and
its state store with every task recorded as submitted, as ``hpcrun submit`` leaves it (array
job ids 1000, 1001, ...). A stand-in ``sacct`` first on PATH prints a prepared file, exactly
the ``sacct -n -P`` text a real Slurm 22.05 prints for these jobs (an allocation line, a
``.batch`` and two step lines per task), and records every call in a log.

What is measured, each in this process with the package of this checkout:

* ``sacct``: running the stand-in ``sacct`` itself (process start and the whole text read
  through a pipe), the floor any status poll pays;
* ``poll running``: ``hpcrun.operate.tracking.track.poll`` when every task turns RUNNING (N transitions
  recorded);
* ``poll unchanged``: the same answer again: N tasks in flight, nothing to record (the steady
  state of a long campaign's ``status --watch``);
* ``poll completed``: every task turns COMPLETED with exit code, CPU time, CPUs, MaxRSS, start
  and end (N transitions recorded, each finished job's run directory looked at for its QA file).

Reported: seconds of each, the overhead of each poll beyond ``sacct`` and the number of sacct
calls per poll (must be 1). Targets beyond sacct (issues 14 and 28): < 1 s for the poll in which
every task starts, < 0.3 s for the steady poll, < 2 s for the poll in which every task ends. Then
a day of the campaign at one poll a minute, projected from the measured polls (each job starts
and ends once, every other poll is the steady one; CPU of the polling process plus sacct's wall
time): its share of one core, target < 2% (issue 28).
Beside each burst, its floor in the same run (``floor``): on a copy of the same store, taken just
before the poll, a bare ``sqlite3`` loop does the least any tracker of these jobs must do - read the
jobs in flight (one join), split each sacct line once, match each task to its submission, insert one
row per transition (only the columns a start or an end fills), and move the submissions and their
inputs to the new state by id lists, in one transaction. Then the same loop recording what hpcrun
records of each transition (every column it fills, each field parsed, times in UTC, an ended job's
MaxRSS from its steps): the least a tracker that keeps hpcrun's records must do. Their ratios say
how far hpcrun's poll is from them; a target below a floor cannot be met by any implementation of
that work on this store.
``--profile DIR`` runs the polls under cProfile instead (slower) and writes one file each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synthetic_campaign import make_plan  # noqa: E402

# seconds beyond sacct (issue 14): every task starts, nothing changed, every task ends
TARGETS = {"running": 1.0, "unchanged": 0.3, "completed": 2.0}

SACCT = """#!/bin/sh
printf '%s\n' "$*" >> "{log}"
case " $* " in
  *" -X "*) exec awk -F '|' 'index($1, ".") == 0' "{answer}" ;;   # allocations only: no step lines
esac
exec cat "{answer}"
"""
CALLS = {"running": 1, "unchanged": 1, "completed": 2}   # the jobs; the steps of those that ended (issue 46)


def record_submissions(plan: Path) -> list:
    """The store as `hpcrun submit` leaves it; returns [(array job id, tasks)]."""
    from hpcrun.operate.submission.submit import open_plan_store, read_manifest, register, scripts_of
    from hpcrun.store.records import NewSubmission

    manifest = read_manifest(plan)
    arrays = []
    with open_plan_store(plan) as store:
        campaign = register(store, manifest)
        for k, script in enumerate(scripts_of(manifest)):
            jobs = list(range(script.first, script.last + 1))
            claim = store.claim_jobs(campaign.id, jobs)
            job_id = str(1000 + k)
            by_job = {i.job_index: i.id for i in claim.inputs}
            store.record_submissions(campaign.id, [
                NewSubmission(job_id, script.path, script.sha256, f"status-bench.{claim.token[:12]}", [by_job[j]],
                              j - script.first, claim.token) for j in jobs])
            arrays.append((job_id, len(jobs)))
    return arrays


def answered(text: str, asked: list) -> Tuple[int, int]:
    """Rows and bytes the stand-in printed for these calls (``-X``: the allocation lines alone)."""
    rows = size = 0
    for args in asked:
        lines = text.splitlines()
        if " -X " in f" {args} ":
            lines = [line for line in lines if "." not in line.split("|", 1)[0]]
        rows += len(lines)
        size += sum(len(line) + 1 for line in lines)
    return rows, size


def sacct_text(arrays: list, state: str) -> str:
    lines = []
    raw = 100_000
    for job_id, tasks in arrays:
        for t in range(tasks):
            raw += 1
            tid = f"{job_id}_{t}"
            if state == "RUNNING":   # what sacct shows of a running job with its steps: batch, extern, two sruns
                lines.append(f"{tid}|{raw}|status-bench.x|RUNNING|0:0|None|42|00:00:00|2|nid001|"
                             "2026-11-22T08:00:00|Unknown|15G|")
                for step, name in (("batch", "batch"), ("extern", "extern"), ("0", "bash"), ("1", "bash")):
                    lines.append(f"{tid}.{step}|{raw}.{step}|{name}|RUNNING|0:0||42|00:00:00|2|nid001|"
                                 "2026-11-22T08:00:01|Unknown||")
                continue
            lines.append(f"{tid}|{raw}|status-bench.x|COMPLETED|0:0|None|600|19:50.125|2|nid001|"
                         "2026-11-22T08:00:00|2026-11-22T08:10:00|15G|")
            lines.append(f"{tid}.batch|{raw}.batch|batch|COMPLETED|0:0||600|00:01.001|2|nid001|"
                         "2026-11-22T08:00:00|2026-11-22T08:10:00||14404K")
            lines.append(f"{tid}.0|{raw}.0|bash|COMPLETED|0:0||599|00:00.349|2|nid001|"
                         "2026-11-22T08:00:01|2026-11-22T08:10:00||120188K")
            lines.append(f"{tid}.1|{raw}.1|bash|COMPLETED|0:0||598|19:48.775|2|nid001|"
                         "2026-11-22T08:00:01|2026-11-22T08:09:59||1.5G")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="run each poll under cProfile (times then include the profiler) and write "
                         "DIR/status-<poll>.prof")
    args = ap.parse_args()
    os.environ["HPCRUN_PROFILE_PATH"] = str(REPO / "site-profiles")
    work = Path(tempfile.mkdtemp(prefix="hpcrun-status-bench-", dir=args.workdir))
    try:
        import subprocess

        from hpcrun.operate.tracking.track import poll

        t0 = time.perf_counter()
        plan = make_plan(work, "status-bench", args.tasks, "always")
        arrays = record_submissions(plan)
        setup_s = time.perf_counter() - t0
        bindir, answer, log = stand_in_sacct(work)
        os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
        result: dict = {"tasks": args.tasks, "arrays": len(arrays), "setup_s": setup_s, "polls": {}}
        for label, state in (("running", "RUNNING"), ("unchanged", "RUNNING"), ("completed", "COMPLETED")):
            answer.write_text(sacct_text(arrays, state))
            calls_before = len(log.read_text().splitlines())
            if label != "unchanged":   # the floors' copies of the store as the poll finds it (not timed)
                snapshot(plan / "state.db", work / "floor.db")
                snapshot(plan / "state.db", work / "full.db")
            t0, c0 = time.perf_counter(), time.process_time()
            if args.profile:
                import cProfile
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                prof = cProfile.Profile()
                report = prof.runcall(poll, plan)
                prof.dump_stats(str(Path(args.profile) / f"status-{label}.prof"))
            else:
                report = poll(plan)
            poll_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            asked = log.read_text().splitlines()[calls_before:]
            calls = len(asked)
            t0 = time.perf_counter()   # the stand-in again, as the poll called it: the floor any poll pays
            for words in asked:
                subprocess.run(["sacct", *words.split()], capture_output=True, text=True, check=True)
            sacct_s = time.perf_counter() - t0
            rows, size = answered(answer.read_text(), asked)
            floor = floor_s(work / "floor.db", answer.read_text(), state) if label != "unchanged" else None
            full = floor_s(work / "full.db", answer.read_text(), state, True) if label != "unchanged" else None
            want = {"running": "running", "completed": "done", "unchanged": "running"}[label]
            assert report.counts[want] == args.tasks, report.counts
            result["polls"][label] = {"poll_s": poll_s, "cpu_s": cpu_s, "sacct_s": sacct_s,
                                      "beyond_sacct_s": poll_s - sacct_s,
                                      "transitions": report.observed, "sacct_calls": calls,
                                      "sacct_rows": rows, "sacct_bytes": size,
                                      "sacct_rows_with_steps": len(answer.read_text().splitlines()),
                                      "sacct_bytes_with_steps": len(answer.read_text().encode()),
                                      "target_s": TARGETS[label], "floor_s": floor, "full_floor_s": full,
                                      "pass": poll_s - sacct_s < TARGETS[label] and calls == CALLS[label]}
        result["day"] = day_share(result["polls"])
        result["forecast_s"] = forecast_s(plan)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{args.tasks} tasks in {result['arrays']} arrays (setup {result['setup_s']:.1f} s, not timed)")
        for label, r in result["polls"].items():
            print(f"poll {label:9s}: {r['poll_s']:6.2f} s, sacct alone {r['sacct_s']:.2f} s, beyond sacct "
                  f"{r['beyond_sacct_s']:.2f} s (target < {r['target_s']:g} s: {'PASS' if r['pass'] else 'FAIL'}), "
                  f"{r['transitions']} transitions, {r['sacct_calls']} sacct call(s)")
            print(f"      sacct returned {r['sacct_rows']:,} rows, {r['sacct_bytes'] / 1e6:.1f} MB (every job with its "
                  f"steps, as before issue 46: {r['sacct_rows_with_steps']:,} rows, "
                  f"{r['sacct_bytes_with_steps'] / 1e6:.1f} MB)")
            if r["floor_s"] is not None:
                print(f"      floor (bare sqlite3 loop, same store and text): {r['floor_s']:.2f} s; "
                      f"ratio {r['beyond_sacct_s'] / r['floor_s']:.1f}x"
                      f"{'; the target is below the floor' if r['floor_s'] >= r['target_s'] else ''}")
                print(f"      floor recording hpcrun's columns (each field parsed, times in UTC, MaxRSS of the "
                      f"steps): {r['full_floor_s']:.2f} s; ratio {r['beyond_sacct_s'] / r['full_floor_s']:.1f}x"
                      f"{'; the target is below it' if r['full_floor_s'] >= r['target_s'] else ''}")
        print(f"forecast (what `hpcrun status` adds to the poll: the newest runs read, issue 40): "
              f"{result['forecast_s']:.2f} s")
        d = result["day"]
        print(f"a day of {args.tasks} jobs at one poll a minute ({d['polls']} polls: every start and every end "
              f"once, the rest steady): {d['cpu_s']:.0f} s of CPU in the supervisor, sacct included "
              f"{d['with_sacct_s']:.0f} s = {d['share_with_sacct']:.2%} of a core "
              f"(target < {DAY_TARGET:.0%}: {'PASS' if d['pass'] else 'FAIL'})")
    return 0


def forecast_s(plan: Path) -> float:
    """Seconds of the forecast on the store as the last poll left it (every task ended)."""
    from hpcrun.operate.campaign.forecast import of_store
    from hpcrun.operate.plandir import open_plan_store, read_manifest

    manifest = read_manifest(plan, jobs=False)
    with open_plan_store(plan) as store:
        campaign_id = store.get_campaign(manifest.campaign).id
        t0 = time.perf_counter()
        f = of_store(store, campaign_id, manifest)
        took = time.perf_counter() - t0
    assert f.ready, f
    return took


def stand_in_sacct(work: Path) -> Tuple[Path, Path, Path]:
    """work/bin/sacct printing work/sacct.txt and logging each call in work/sacct.calls: (bin, answer, log)."""
    bindir, answer, log = work / "bin", work / "sacct.txt", work / "sacct.calls"
    bindir.mkdir()
    (bindir / "sacct").write_text(SACCT.format(log=log, answer=answer))
    (bindir / "sacct").chmod(0o755)
    log.write_text("")
    return bindir, answer, log


def snapshot(db: Path, copy: Path) -> None:
    """A consistent copy of a store (what its write-ahead log holds included)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)


def floor_s(db: Path, text: str, state: str, full: bool = False) -> float:
    """Seconds of the least a poll recording these transitions must do, on a copy of the store: one
    join for the jobs in flight, one split per sacct line, one dict match per task, one row inserted
    per transition, two updates by id lists, one commit (see the module's docstring). With the
    collector paused and the connection set up as the store sets up its own (foreign keys checked,
    WAL with synchronous NORMAL). ``full``: recording what hpcrun records of each transition instead
    (every column it fills, each field parsed, times in UTC, an ended job's MaxRSS from its steps)."""
    import sqlite3

    from hpcrun.bulk import bulk

    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA foreign_keys = ON")   # as the store opens it on a local filesystem
    con.execute("PRAGMA synchronous = NORMAL")
    ended = state != "RUNNING"
    try:
        with bulk():
            return _floor_loop(con, text, state, ended, full)
    finally:
        con.close()


def _floor_loop(con: Any, text: str, state: str, ended: bool, full: bool) -> float:
    t0 = time.perf_counter()
    con.execute("BEGIN IMMEDIATE")
    active = con.execute(
        "SELECT s.id, s.job_id, s.array_index, s.last_state FROM hpcrun_submission s JOIN hpcrun_input i "
        "ON i.last_submission_id = s.id WHERE i.state IN ('submitted', 'running')").fetchall()
    now = dt.datetime.now(dt.timezone.utc).isoformat()
    if full:
        rows = _full_rows(active, text, now)
        con.executemany("INSERT INTO hpcrun_state_change (submission_id, observed_at, slurm_state, exit_code, "
                        "signal, node, elapsed_s, cpu_s, max_rss_bytes, alloc_cpus, started_at, ended_at, "
                        "req_mem_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    else:
        jobs = {}
        for line in text.splitlines():
            parts = line.split("|")
            if "." not in parts[0]:   # steps: their memory is a column the floor leaves out
                jobs[parts[0]] = parts
        rows = []
        for sid, job_id, index, last in active:
            p = jobs[f"{job_id}_{index}"]
            if p[3] != last:
                rows.append((sid, now, p[3], p[9], p[8], p[10], p[11] if ended else None))
        con.executemany("INSERT INTO hpcrun_state_change (submission_id, observed_at, slurm_state, node, "
                        "alloc_cpus, started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    ids = [r[0] for r in rows]
    for start in range(0, len(ids), 20000):
        listed = ",".join(map(str, ids[start:start + 20000]))
        con.execute(f"UPDATE hpcrun_submission SET last_state = ?, last_observed_at = ? WHERE id IN ({listed})",
                    (state, now))
        con.execute(f"UPDATE hpcrun_input SET state = ?, updated_at = ? WHERE last_submission_id IN ({listed})",
                    ("done" if ended else "running", now))
    con.execute("COMMIT")
    return time.perf_counter() - t0


_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _full_rows(active: list, text: str, now: str) -> list:
    """The rows hpcrun inserts for these transitions, made by the plainest loop: the allocation line's
    fields parsed (state, exit code and signal, elapsed, CPU time, CPUs, requested memory), start and
    end from sacct's local time to UTC text (each distinct text once), the largest MaxRSS of the steps."""
    from functools import cache

    @cache
    def utc(t: str) -> Any:
        return None if t in ("", "Unknown", "None") else dt.datetime.fromisoformat(t).astimezone(
            dt.timezone.utc).replace(tzinfo=None).isoformat(" ")   # as the store keeps times: UTC, naive

    @cache
    def size(t: str) -> Any:
        return int(float(t[:-1]) * _UNIT[t[-1]]) if t and t[-1] in _UNIT else (int(t) if t.isdigit() else None)

    @cache
    def cpu_s(t: str) -> float:
        mins, _, secs = t.rpartition(":")
        hours, _, mins = mins.rpartition(":")
        return int(hours or 0) * 3600 + int(mins or 0) * 60 + float(secs)

    jobs, rss = {}, {}
    for line in text.splitlines():
        parts = line.split("|")
        owner, dot, _ = parts[0].partition(".")
        if dot:
            mem = size(parts[-1])
            if mem is not None and mem > rss.get(owner, -1):
                rss[owner] = mem
        else:
            jobs[owner] = parts
    rows = []
    for sid, job_id, index, last in active:
        key = f"{job_id}_{index}"
        p = jobs[key]
        state = p[3].split(" ")[0].rstrip("+")
        if state != last:
            code, _, sig = p[4].partition(":")
            rows.append((sid, now, state, int(code), int(sig), p[9], float(p[6]) if p[6].isdigit() else None,
                         cpu_s(p[7]), rss.get(key), int(p[8]) if p[8].isdigit() else None, utc(p[10]), utc(p[11]),
                         size(p[12])))
    return rows


DAY_TARGET = 0.02   # issue 28: the supervisor's CPU over a day-long campaign of 100k jobs, share of one core


def day_share(polls: dict) -> dict:
    """A day at one poll a minute, projected from the measured polls: the jobs start and end once each
    (their transitions cost what the two burst polls cost, whether recorded in one poll or spread over
    many), every other poll is the steady one. CPU of this process, plus each poll's sacct run."""
    n = 24 * 60
    steady = n - 2
    cpu = polls["running"]["cpu_s"] + polls["completed"]["cpu_s"] + steady * polls["unchanged"]["cpu_s"]
    sacct = sum(p["sacct_s"] for p in polls.values()) + (steady - 1) * polls["unchanged"]["sacct_s"]
    share = (cpu + sacct) / 86400.0
    return {"polls": n, "cpu_s": cpu, "with_sacct_s": cpu + sacct, "share_with_sacct": share,
            "pass": share < DAY_TARGET}


if __name__ == "__main__":
    sys.exit(main())
