"""The campaign report computed from a real state store (SQLite), and its HTML/JSON/PNG output."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from hpcrun.report.figures import build
from hpcrun.report.html import render_html, write_report
from hpcrun.store.records import NewInput, NewStateChange, NewSubmission, QaResult
from hpcrun.store.store import open_store

T0 = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.timezone.utc)


def _policy():
    from hpcrun.model.retry import RetrySpec, effective_rules
    from hpcrun.operate.retries.policy import RetryPolicy

    return RetryPolicy(effective_rules(RetrySpec()), 10, {}, 3600)


def _store_with_runs(tmp_path):
    """4 inputs in 4 plan jobs: two complete (one fails QA), one fails twice, one never submitted."""
    store = open_store(tmp_path)
    c = store.register_campaign("reco", "s" * 64, "p" * 64)
    store.add_inputs(c.id, [NewInput(f"/raw/f{i}.daq", size=(i + 1) * 10**9, job_index=i, events=100 * (i + 1))
                            for i in range(4)])
    sub_ids = {}
    for attempt, jobs in enumerate([[0, 1, 2], [2]]):
        if attempt:
            assert _policy().apply(store, c.id) == ([2], [])
        claim = store.claim_jobs(c.id, jobs)
        by_job = {i.job_index: i.id for i in claim.inputs}
        subs = [NewSubmission(f"{500 + attempt}", "jobs/array001.sbatch", "d" * 64, f"reco.{claim.token[:12]}",
                              [by_job[j]], j, claim.token) for j in jobs]
        ids = store.record_submissions(c.id, subs)
        for j, sid in zip(jobs, ids):
            sub_ids[(attempt, j)] = sid
        end = T0 + dt.timedelta(minutes=10 * (attempt + 1))
        changes = []
        for j in jobs:
            sid = sub_ids[(attempt, j)]
            ok = j != 2
            changes.append(NewStateChange(sid, "COMPLETED" if ok else "FAILED", end, 0 if ok else 7, 0, "nid1",
                                          elapsed_s=600.0, cpu_s=600.0 * 4 * (0.5 if j == 1 else 1.0),
                                          max_rss_bytes=2 * 1024**3, reason=None if ok else "chain(s) failed: 1(rc=3)",
                                          alloc_cpus=4, started_at=end - dt.timedelta(minutes=10), ended_at=end,
                                          req_mem_bytes=8 * 1024**3))
        store.record_state_changes(c.id, changes)
        if attempt == 0:
            store.record_qa([QaResult(by_job[0], "f0.out", True, 100, 100, sub_ids[(0, 0)]),
                             QaResult(by_job[1], "f1.out", False, 200, 150, sub_ids[(0, 1)])])
    return store, c


def test_figures_of_merit(tmp_path):
    store, c = _store_with_runs(tmp_path)
    with store:
        report = build("reco", store.report_rows(c.id), {0: "reco.00001", 1: "reco.00002", 2: "reco.00003",
                                                         3: "reco.00004"})
    # f0 done + QA pass; f1 done but QA failed; f2 failed twice; f3 never submitted
    assert report.inputs == {"pending": 1, "submitted": 0, "running": 0, "done": 2, "failed": 1, "parked": 0}
    assert report.succeeded == 1
    assert report.success_rate == pytest.approx(1 / 3)
    assert report.memory_efficiency == pytest.approx(0.25)          # seff: 2 GiB used of 8 GiB asked
    assert [m.mem_efficiency for m in report.runs] == [pytest.approx(0.25)] * len(report.runs)
    assert [n for _t, n in report.timeline] == [1, 2] and [n for _t, n in report.qa_timeline] == [1]
    assert report.completion == pytest.approx(1 / 4)
    # 4 ended runs of 600 s x 4 CPUs; CPU: 2400 + 1200 + 2400 + 2400
    assert report.cpu_efficiency == pytest.approx((2400 + 1200 + 2400 + 2400) / (4 * 2400))
    assert report.runs_ended == 4 and report.runs_completed == 2
    assert [r.cpu_efficiency for r in report.runs] == [1.0, 0.5]
    assert [r.events for r in report.runs] == [100, 200]  # from QA's count of input events
    assert report.runs[0].walltime_per_event_s == pytest.approx(6.0)
    assert report.runs[1].mb_per_s == pytest.approx(2e9 / 1e6 / 600)
    assert report.span_s == 1200.0  # 08:00 .. 08:20
    assert report.throughput_mb_per_s == pytest.approx(3e9 / 1e6 / 1200)
    assert report.throughput_events_per_s == pytest.approx(300 / 1200)
    assert [(f.reason, f.count) for f in report.failures] == [("chain failed (exit 7)", 2)]
    assert report.failures[0].example.startswith("chain(s) failed")
    assert report.attempts == {0: 1, 1: 2, 2: 1}
    assert (report.qa_passed, report.qa_failed, report.events_in, report.events_out) == (1, 1, 300, 250)
    assert [n for _, n in report.timeline] == [1, 2]
    # per core: 1e9 + 2e9 bytes over 2 completed runs of 600 s x 4 CPUs; 100 + 200 events
    assert report.mb_per_s_per_core == pytest.approx(3e9 / 1e6 / (2 * 600 * 4))
    assert report.events_per_s_per_core == pytest.approx(300 / (2 * 600 * 4))
    assert report.runs[1].mb_per_s_per_core == pytest.approx(2e9 / 1e6 / 600 / 4)


def test_throughput_per_core_is_shown_against_the_target(tmp_path):
    from hpcrun.report.figures import transfers_of
    from hpcrun.report.html import merit_rows

    store, c = _store_with_runs(tmp_path)
    with store:
        report = build("reco", store.report_rows(c.id), {})
    report.targets = {"mb_per_s_per_core": 12.5, "events_per_s_per_core": 0.01}
    rows = dict(merit_rows(report))
    assert rows["input MB/s per core, completed runs"] == "0.625 (target 12.5: not met)"
    assert rows["input events/s per core, completed runs"] == "0.0625 (target 0.01: met)"
    report.transfers = transfers_of([(4_000_000, 2.0, 51, "server"), (4_000_000, 1.0, 0, "server"),
                                     (2_000_000, 2.0, 0, "server"), (9_000_000, 0.1, 0, "local")],
                                    [(6_000_000, 2.0, 2), (9_000_000, 0.1, 2)])
    rows = dict(merit_rows(report))
    assert rows["inputs copied in (xrdcp): files, GB, failed attempts"] == "2, 0.006, 1"
    assert rows["copy rate, mean / slowest file (MB/s)"] == "2 / 1"
    # by the way each input came: read in place are no copies; per core: each job's MB / its stage-in / CPUs
    assert rows["inputs read in place (local): inputs, GB, seconds per input, MB/s"] == "1, 0.009, 0.1, 90"
    assert rows["inputs from the server (server): inputs, GB, seconds per input, MB/s"] == "2, 0.006, 1.5, 2"
    per_core = rows["stage-in MB/s per core (a job's MB / its stage-in time / its CPUs)"]
    assert per_core == "23.2 (target 12.5: met)"   # (6 MB / 2 s / 2 + 9 MB / 0.1 s / 2) / 2


def test_html_escapes_what_users_wrote(tmp_path):
    store, c = _store_with_runs(tmp_path)
    with store:
        report = build("reco", store.report_rows(c.id), {})
    report.failures[0].example = "<script>alert(1)</script>"
    html = render_html(report, "/x/state.db", {})
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_report_directory_is_replaced_whole(tmp_path):
    (tmp_path / "plan").mkdir()
    store, c = _store_with_runs(tmp_path / "plan")
    with store:
        report = build("reco", store.report_rows(c.id), {})
    out = tmp_path / "report"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    index = write_report(report, out, "state.db")
    assert index == out / "index.html"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["completed_vs_time.png", "cpu_efficiency.png", "index.html", "report.json",
                     "walltime_per_event.png"]
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names if n.endswith(".png"))
    assert json.loads((out / "report.json").read_text())["succeeded"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report")]


def test_report_cli_needs_a_submitted_plan(cli, spec_factory, tmp_path):
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan
    plan_dir = write_plan(load_plan(spec_factory({}, inputs=2)), tmp_path / "plan").out_dir
    result = cli("report", str(plan_dir))
    assert result.exit_code == 2 and "no campaign state yet" in result.output and "hpcrun submit" in result.output
