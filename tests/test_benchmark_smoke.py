"""benchmarks/plan_scale.py still runs: a tiny size, both shapes, both baselines (a few seconds).

It does not check any performance target (that is what the benchmark reports); it checks that
the benchmark runs against the current package and templates, prints its table, and that its
baselines still render exactly the scripts hpcrun writes (so the ratio compares like with like).
"""

import json
import subprocess
import sys

from .conftest import REPO

COLUMNS = ["shape", "inputs", "scripts", "files", "plan_s", "cpu_s", "load_s", "peak_MB",
           "base_s", "base_MB", "floor_s", "ratio", "perfile_s", "ratio_pf", "plan_B/script", "base_B/script"]


def test_plan_scale_benchmark_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "plan_scale.py"), "--sizes", "50",
         "--target-inputs", "50", "--workdir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the human-readable table (stderr with --json): header, one row per shape, target lines
    lines = proc.stderr.splitlines()
    header = next((line.split() for line in lines if line.split()[:2] == ["shape", "inputs"]), None)
    assert header == COLUMNS, proc.stderr[-3000:]
    rows = {line.split()[0]: line.split() for line in lines
            if line.split()[:2] in (["array", "50"], ["per-job", "50"])}
    assert set(rows) == {"array", "per-job"}
    assert all(len(r) == len(COLUMNS) for r in rows.values())
    for target in ("ratio plan/floor (the same scripts)", "ratio plan/floor (list read + task lines)"):
        assert any(target in line and ("[PASS]" in line or "[FAIL]" in line) for line in lines), target

    doc = json.loads(proc.stdout)
    results = {r["shape"]: r for r in doc["results"]}
    array, per_job = results["array"], results["per-job"]
    for r in (array, per_job):
        assert r["plan"]["status"] == "ok" and r["baseline_same_scripts"]["status"] == "ok"
        assert r["plan"]["jobs"] == 50 and r["plan"]["peak_mb"] > 0
        # the baseline renders the plan's own contexts: same number of scripts, same bytes
        assert r["baseline_same_scripts"]["scripts"] == r["plan"]["scripts"]
        assert r["baseline_same_scripts"]["script_bytes"] == r["plan"]["script_bytes"]
        assert r["ratio"] > 0
    assert array["plan"]["scripts"] == 1 and per_job["plan"]["scripts"] == 50
    assert array["baseline_per_file"]["status"] == "ok"
    assert array["baseline_per_file"]["scripts"] == 50
    assert per_job["baseline_per_file"] is None


def test_iotune_overhead_benchmark_runs(tmp_path):
    """benchmarks/iotune_overhead.py at one tiny point: the three modes run and report ratios."""
    import shutil

    import pytest

    if shutil.which("fio") is None:
        pytest.skip("fio is not installed")
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "iotune_overhead.py"), "--target", str(tmp_path),
         "--transfer-sizes", "64k", "--writers", "1", "--block", "1m", "--repeat", "1", "--json"],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next(line.split() for line in proc.stderr.splitlines() if line.split()[:1] == ["mode"])
    assert header == ["mode", "best_s", "runs_s", "ratio", "overhead_s"]
    assert any("ratio local/direct" in line and ("[PASS]" in line or "[FAIL]" in line)
               for line in proc.stderr.splitlines())
    doc = json.loads(proc.stdout)
    assert set(doc["best_s"]) == {"direct", "local", "job", "job-sh"} and doc["points"] == 1
    assert all(v > 0 for v in doc["best_s"].values()) and set(doc["ratios"]) == {"local", "job", "job-sh"}
    assert list(tmp_path.iterdir()) == []          # every mode cleaned up its files


def test_status_scale_benchmark_runs(tmp_path):
    """benchmarks/status_scale.py at 300 tasks: one sacct call per poll, every transition recorded."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "status_scale.py"), "--tasks", "300", "--workdir", str(tmp_path),
         "--json"], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    polls = result["polls"]
    assert list(polls) == ["running", "unchanged", "completed"]
    assert [polls[p]["transitions"] for p in polls] == [300, 0, 300]
    # the jobs without their steps; the steps of the jobs that ended alone (issue 46)
    assert [polls[p]["sacct_calls"] for p in polls] == [1, 1, 2]
    assert polls["unchanged"]["sacct_rows"] == 300 and polls["unchanged"]["sacct_rows_with_steps"] == 1500


def test_the_full_floor_records_what_hpcrun_records(tmp_path, monkeypatch):
    """status_scale's second floor inserts, for a start and for an end, the very rows hpcrun's poll
    inserts (every column but the id and the observation time): it is a floor of the same work."""
    import sqlite3
    from contextlib import closing

    from hpcrun.operate.tracking.track import poll

    from .synthetic_status import status_campaign

    ss, plan, arrays, answer = status_campaign(tmp_path, monkeypatch, "floor", 60)
    cols = ("submission_id, slurm_state, exit_code, signal, node, elapsed_s, cpu_s, max_rss_bytes, alloc_cpus, "
            "started_at, ended_at, req_mem_bytes")
    for state in ("RUNNING", "COMPLETED"):
        answer.write_text(ss.sacct_text(arrays, state))
        ss.snapshot(plan / "state.db", tmp_path / "full.db")
        with closing(sqlite3.connect(plan / "state.db")) as con:
            before = con.execute("SELECT coalesce(max(id), 0) FROM hpcrun_state_change").fetchone()[0]
        poll(plan)
        assert ss.floor_s(tmp_path / "full.db", answer.read_text(), state, True) > 0
        rows = []
        for db in (plan / "state.db", tmp_path / "full.db"):
            with closing(sqlite3.connect(db)) as con:
                rows.append(con.execute(f"SELECT {cols} FROM hpcrun_state_change WHERE id > ? ORDER BY submission_id",
                                        (before,)).fetchall())
        assert len(rows[0]) == 60 and rows[0] == rows[1]


def test_removals_benchmark_runs(tmp_path):
    """benchmarks/removals.py at a tiny size: both ways remove every run and report their times."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "removals.py"), "--runs", "20", "--pairs", "1",
                           "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert proc.stdout.count("20 runs removed in") == 2 and "several at once / one at a time" in proc.stdout
    assert tmp_path.is_dir() and not (tmp_path / "runs").exists()
