"""Array mode near its end (issue 55): the last jobs' exit codes, looked for between two polls, bring the next round
forward; an earlier attempt's does not, late binding and a campaign with many jobs open are not watched, and the
rounds brought forward for one set of open jobs are bounded (the scheduler stays the authority)."""

from __future__ import annotations

import datetime as dt
import os
import time
from types import SimpleNamespace

from hpcrun.operate.supervision import array_ends


def _exit_code(path, at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("0\n")
    os.utime(path, (at, at))


def test_the_last_jobs_exit_codes_bring_the_next_round_forward(tmp_path):
    now = time.time()
    subs = [SimpleNamespace(job_name=f"c.0000{i}", submitted_at=dt.datetime.fromtimestamp(now, dt.timezone.utc))
            for i in (1, 2)]
    store = SimpleNamespace(active_submissions=lambda campaign_id: subs)
    run = tmp_path / "run"
    watch = array_ends.Watch(str(run))
    watch.after_round(store, 7, 2, late=False)
    assert not watch.read()   # no job ended
    _exit_code(run / "c.00001" / "100" / "exit_code", now - 600)   # an earlier attempt's
    _exit_code(run / "c.00001" / "101" / "exit_code", now + 1)
    watch.next_at = 0
    assert not watch.read() and watch.ended == {"c.00001"}   # one of the two
    _exit_code(run / "c.00002" / "102" / "exit_code", now - 100)   # only an earlier attempt's
    watch.next_at = 0
    assert not watch.read()
    _exit_code(run / "c.00002" / "103" / "exit_code", now - 5)   # its node's clock a little behind
    watch.next_at = 0
    assert watch.read()
    for _ in range(array_ends.QUICK_ROUNDS - 1):   # the accounting lags: a few more rounds brought forward
        watch.after_round(store, 7, 2, late=False)
        assert watch.read()
    watch.after_round(store, 7, 2, late=False)
    assert not watch.read()   # then the polls keep their interval
    subs.pop()
    watch.after_round(store, 7, 1, late=False)   # other jobs open: brought forward again
    assert watch.read()


def test_late_binding_and_many_open_jobs_are_not_watched(tmp_path):
    subs = [SimpleNamespace(job_name="c.00001", submitted_at=dt.datetime.now(dt.timezone.utc))]
    store = SimpleNamespace(active_submissions=lambda campaign_id: subs)
    watch = array_ends.Watch(str(tmp_path / "run"))
    for open_jobs, late in ((1, True), (array_ends.WATCH_MAX + 1, False), (0, False)):
        watch.after_round(store, 7, open_jobs, late=late)
        assert watch.jobs == {} and not watch.read()


def test_a_look_lists_at_most_per_s_jobs_and_waits_longer_for_more(tmp_path, monkeypatch):
    subs = [SimpleNamespace(job_name=f"c.{i:05d}", submitted_at=dt.datetime.now(dt.timezone.utc)) for i in range(40)]
    store = SimpleNamespace(active_submissions=lambda campaign_id: subs)
    listed: list = []
    monkeypatch.setattr(array_ends, "_ended_since", lambda job_dir, since: listed.append(job_dir) or False)
    watch = array_ends.Watch(str(tmp_path / "run"))
    watch.after_round(store, 7, 40, late=False)
    t0 = time.monotonic()
    assert not watch.read()
    assert len(listed) == array_ends.PER_S and watch.next_at >= t0 + 40 / array_ends.PER_S
    assert not watch.read() and len(listed) == array_ends.PER_S   # not again before then
    watch.next_at = 0
    assert not watch.read() and len(set(listed)) == 2 * array_ends.PER_S   # the next ones, round the list
