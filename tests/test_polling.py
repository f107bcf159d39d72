"""Polite polling: once a minute by default, never below the site's minimum, backing off while
nothing changes (login nodes are shared; the scheduler is everyone's)."""

from __future__ import annotations

from types import SimpleNamespace

import hpcrun.operate.tracking.track as track
from hpcrun.operate.manifest import Manifest
from hpcrun.operate.plandir import next_interval, poll_interval


def test_the_interval_defaults_to_a_minute_and_respects_the_site_minimum():
    site = Manifest.from_dict({"submit": {"min_poll_interval": 30}})
    assert poll_interval(site, None) == 60
    assert poll_interval(site, 5) == 30          # raised to the site's minimum
    assert poll_interval(site, 120) == 120
    assert poll_interval(Manifest.from_dict({"submit": {}}), 2) == 2   # plans from before the setting


def test_backoff_doubles_up_to_ten_times_and_drops_back_on_a_change():
    seen, current = [], 60.0
    for _ in range(6):
        current = next_interval(60, current, changed=False)
        seen.append(current)
    assert seen == [120, 240, 480, 600, 600, 600]
    assert next_interval(60, 600, changed=True) == 60


def test_watch_sleeps_politely(monkeypatch, tmp_path):
    """Five polls: nothing changes twice, a change, nothing, then nothing is left in flight."""
    changes = iter([0, 0, 3, 0, 1])
    left = iter([2, 2, 1, 1, 0])
    slow = Manifest.from_dict({"submit": {"min_poll_interval": 1}})
    monkeypatch.setattr(track, "read_manifest", lambda *a, **k: slow)
    monkeypatch.setattr(track, "poll", lambda *a, **k: SimpleNamespace(
        in_flight=next(left), held=0, finalize_in_flight=False, observed=next(changes)))
    sleeps = []
    track.watch(tmp_path, interval=2, sleep=sleeps.append)
    assert sleeps == [4, 8, 2, 4]


def test_qa_files_of_many_ended_jobs_are_found_through_one_listing_of_the_run_directory(tmp_path, monkeypatch):
    """Above LIST_RUN_DIR_ABOVE ended jobs, run/ is listed once and only the jobs with a directory
    are opened; the rows found are those found by opening every job's file."""
    import datetime as dt

    from hpcrun.operate.outputs import qa_rows
    from hpcrun.store.records import ActiveSubmission

    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    ended = [(ActiveSubmission(k, "100", k, "RUNNING", when, k, f"camp.{k:05d}"), f"{200 + k}") for k in range(12)]
    for a, raw in ended[::3]:   # a third of the jobs ran and wrote QA; the others never started
        (tmp_path / a.job_name / raw).mkdir(parents=True)
        (tmp_path / a.job_name / raw / "qa.tsv").write_text(f"s{a.id}\t10\t10\tpass\ts{a.id}.out\t/d/s{a.id}.daq\n")
    (tmp_path / ended[1][0].job_name).mkdir()   # a directory without a QA file

    def job_dir(a, raw):
        return f"{tmp_path}/{a.job_name}/{raw}"
    opened = []
    real_read = qa_rows.read_or_empty
    monkeypatch.setattr(qa_rows, "read_or_empty", lambda path: opened.append(path) or real_read(path))
    direct = qa_rows._qa_texts(str(tmp_path), job_dir, ended)
    assert len(opened) == 12
    opened.clear()
    monkeypatch.setattr(qa_rows, "LIST_RUN_DIR_ABOVE", 5)
    listed = qa_rows._qa_texts(str(tmp_path), job_dir, ended)
    assert listed == direct and [a.id for a, _ in listed] == [0, 3, 6, 9]
    assert len(opened) == 5   # the four that ran and the one with an empty directory
    assert qa_rows._qa_texts(str(tmp_path / "none"), job_dir, ended) == []   # no run/ yet: nothing ran


def test_polls_of_many_transitions_pause_the_collector_and_keep_the_list_in_flight(tmp_path, monkeypatch):
    """A poll runs with the cyclic collector paused (and gives it back, also when it fails); the jobs in
    flight are kept between polls, updated with the states just recorded, and emptied when every job
    ended in one poll, so the next poll reads nothing from the store's list of them."""
    import gc

    import pytest

    from hpcrun.operate.tracking import lookup
    from hpcrun.operate.tracking.inflight import InFlight
    from hpcrun.store.rows.observations import Observations

    from .synthetic_status import status_campaign

    ss, plan, arrays, answer = status_campaign(tmp_path, monkeypatch, "kept", 40)
    reads, collector = [], []
    real_read, real_record = Observations.active_submissions, Observations.record_transitions
    monkeypatch.setattr(Observations, "active_submissions", lambda self, cid: reads.append(1) or real_read(self, cid))
    monkeypatch.setattr(Observations, "record_transitions",
                        lambda self, cid, ch: collector.append(gc.isenabled()) or real_record(self, cid, ch))
    kept = InFlight()   # as the supervisor and `status --wait` hold it
    builds: list = []   # the index of the jobs in flight: built once, then kept up to date with the list
    real_init = lookup.Index.__init__
    monkeypatch.setattr(lookup.Index, "__init__", lambda self, active: builds.append(len(active)) or real_init(
        self, active))
    assert gc.isenabled()
    answer.write_text(ss.sacct_text(arrays, "RUNNING"))
    assert track.poll(plan, kept=kept).counts["running"] == 40 and len(reads) == 1
    assert track.poll(plan, kept=kept).counts["running"] == 40 and len(reads) == 1   # the kept list, up to date
    assert builds == [40], builds
    assert track.poll(plan).counts["running"] == 40 and len(reads) == 2   # a poll that keeps nothing reads it
    answer.write_text(ss.sacct_text(arrays, "COMPLETED"))
    assert track.poll(plan, kept=kept).counts["done"] == 40 and len(reads) == 2
    assert [k.active for k in kept.kept.values()] == [[]]   # every job ended: nothing kept
    assert track.poll(plan, kept=kept).counts["done"] == 40 and len(reads) == 2
    assert collector == [False] * 5 and gc.isenabled()   # each poll recorded with the collector paused
    monkeypatch.setattr(Observations, "record_transitions", lambda *a: 1 / 0)
    answer.write_text(ss.sacct_text(arrays, "RUNNING").replace("RUNNING", "FAILED"))
    with pytest.raises(ZeroDivisionError):
        track.poll(plan)
    assert gc.isenabled()
