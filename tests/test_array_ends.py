"""Array mode near its end (issue 55): the last jobs' exit codes, looked for between two polls, bring the next round
forward; an earlier attempt's does not, late binding and a campaign with many jobs open are not watched, and the
rounds brought forward for one set of submissions are few and spaced (the scheduler stays the authority)."""

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


def _store(names, at: float):
    subs = [SimpleNamespace(job_name=n, submitted_at=dt.datetime.fromtimestamp(at, dt.timezone.utc)) for n in names]
    return subs, SimpleNamespace(active_submissions=lambda campaign_id: subs)


def test_the_last_jobs_exit_codes_bring_the_next_round_forward(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(array_ends.time, "monotonic", lambda: now[0])
    submitted = time.time()
    subs, store = _store(["c.00001", "c.00002"], submitted)
    run = tmp_path / "run"
    _exit_code(run / "c.00002" / "102" / "exit_code", submitted - 1)   # an earlier attempt's, before the retry
    watch = array_ends.Watch(str(run))
    watch.after_round(store, 7, 2, late=False)
    now[0] += 5
    assert not watch.read()   # no job of these submissions ended
    _exit_code(run / "c.00001" / "101" / "exit_code", submitted + 3)
    now[0] += 1
    assert not watch.read() and watch.ended == {"c.00001"}   # one of the two
    _exit_code(run / "c.00002" / "103" / "exit_code", submitted + 4)
    now[0] += 1
    assert watch.read() and watch.brought   # both ended: the next round now
    # the accounting lags behind the files: rounds brought forward 2, 4, 8, 16 s after the last, then no more
    for wait in (2, 4, 8, 16):
        watch.after_round(store, 7, 2, late=False)
        now[0] += wait - 0.5
        assert not watch.read()
        watch.next_at = 0
        now[0] += 0.5
        assert watch.read(), wait
    watch.after_round(store, 7, 2, late=False)
    now[0] += 100
    assert watch.quick == array_ends.QUICK_ROUNDS and not watch.read()   # then the polls keep their interval
    subs[1].submitted_at = dt.datetime.fromtimestamp(submitted + 60, dt.timezone.utc)   # c.00002 failed, retried
    watch.after_round(store, 7, 2, late=False)
    now[0] += 1
    assert not watch.read() and watch.ended == {"c.00001"}   # its first attempt's exit code is older than the retry
    _exit_code(run / "c.00002" / "104" / "exit_code", submitted + 65)
    now[0] += 1
    assert watch.read()   # a new set of submissions: rounds may be brought forward again


def test_the_site_shortest_interval_holds_for_the_rounds_brought_forward(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(array_ends.time, "monotonic", lambda: now[0])
    submitted = time.time()
    _subs, store = _store(["c.00001"], submitted)
    _exit_code(tmp_path / "run" / "c.00001" / "6" / "exit_code", submitted + 2)
    watch = array_ends.Watch(str(tmp_path / "run"), min_interval_s=30)
    watch.after_round(store, 7, 1, late=False)
    now[0] += 10
    assert not watch.read()   # 10 s after the last round: the site allows a poll every 30 s
    now[0] += 20
    assert watch.read()


def test_a_round_brought_forward_that_saw_nothing_change_keeps_the_pause():
    from hpcrun.operate.supervision.supervise import next_pause

    assert next_pause(60, 600, False, brought=True, first=False) == 600   # the accounting lagged: no back-off
    assert next_pause(60, 600, True, brought=True, first=False) == 60   # it saw the ends: back to the base
    assert next_pause(60, 60, False, brought=False, first=False) == 120   # a poll of its own: backs off
    assert next_pause(60, 600, False, brought=True, first=True) == 60


def test_late_binding_and_many_open_jobs_are_not_watched(tmp_path):
    _subs, store = _store(["c.00001"], time.time())
    watch = array_ends.Watch(str(tmp_path / "run"))
    for open_jobs, late in ((1, True), (array_ends.WATCH_MAX + 1, False), (0, False)):
        watch.after_round(store, 7, open_jobs, late=late)
        assert watch.jobs == {} and not watch.read()


def test_a_look_lists_at_most_per_s_jobs_a_second(tmp_path, monkeypatch):
    _subs, store = _store([f"c.{i:05d}" for i in range(40)], time.time())
    watch = array_ends.Watch(str(tmp_path / "run"))
    watch.after_round(store, 7, 40, late=False)
    listed: list = []
    monkeypatch.setattr(array_ends, "_ended_since", lambda job_dir, since: listed.append(job_dir) or False)
    assert not watch.read()
    assert len(listed) == array_ends.PER_S
    assert not watch.read() and len(listed) == array_ends.PER_S   # not again within the second
    watch.next_at = 0
    assert not watch.read() and len(set(listed)) == 2 * array_ends.PER_S   # the next ones, round the list


def test_a_look_held_by_a_filesystem_that_hangs_never_holds_the_supervisor(tmp_path, monkeypatch):
    """A run directory on a filesystem that does not answer (a network mount cut off): the look is left to end on
    its own after LOOK_S and no other starts meanwhile, so the supervisor's rounds go on (and tell of a store on
    the same filesystem that hangs); once it ended, the looks go on."""
    import threading

    monkeypatch.setattr(array_ends, "LOOK_S", 0.2)
    answers = threading.Event()
    looked: list = []
    monkeypatch.setattr(array_ends, "_ended_since", lambda job_dir, since: looked.append(job_dir) or answers.wait(30))
    _subs, store = _store(["c.00001"], time.time())
    watch = array_ends.Watch(str(tmp_path / "run"))
    watch.after_round(store, 7, 1, late=False)
    t0 = time.monotonic()
    assert not watch.read() and time.monotonic() - t0 < 5 and len(looked) == 1
    watch.next_at = 0
    assert not watch.read() and len(looked) == 1   # none while the first still hangs
    answers.set()
    watch.looking.join(5)
    watch.next_at = 0
    watch.last_round = 0
    assert watch.read() and len(looked) == 2   # it answers again: the job ended
