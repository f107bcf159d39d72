"""A poll of a late-bound campaign reads what changed in the queue, not every task in flight (issue 54, part 3).

The real pilot (bash and the agent) claims and commits; ``hpcrun.operate.tracking.track.poll`` records
into a real SQLite store. The tests make the full read of the jobs in flight fail, so that a poll that
fell back to it would fail here, and count the commits a poll reads (``Queue.committed``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcrun.backends.late import ledger
from hpcrun.backends.late.changes import Cursor, read_changes
from hpcrun.backends.late.queue import Queue
from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.submission.submit import submit
from hpcrun.operate.tracking import track
from hpcrun.store.rows.observations import Observations

from .test_late_binding import _claimed, _pilot, _plan, _spec, _wait

pytestmark = pytest.mark.usefixtures("fake_slurm")


@pytest.fixture
def no_full_read(monkeypatch):
    """Any read of every job in flight fails (the running ones alone may be read)."""
    real = Observations.active_submissions

    def only_running(self, campaign_id, states=("submitted", "running")):
        assert tuple(states) == ("running",), "a late-bound poll read every job in flight"
        return real(self, campaign_id, states)
    monkeypatch.setattr(Observations, "active_submissions", only_running)


def _counted(monkeypatch) -> list:
    seen: list = []
    real = Queue.committed

    def committed(self, task, outputs, known=None, res=None):
        seen.append(task)
        return real(self, task, outputs, known, res)
    monkeypatch.setattr(Queue, "committed", committed)
    return seen


def _states(plan: Path) -> dict:
    with open_plan_store(plan) as store:
        cid = store.get_campaign("latelocal").id
        return {s: n for s, n in store.counts_by_state(cid).items() if n}


def test_a_poll_records_each_commit_once_and_then_reads_nothing_again(tmp_path, monkeypatch, no_full_read):
    plan = _plan(tmp_path, _spec(tmp_path, 6, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    assert _states(plan) == {"submitted": 6}
    logs = _wait(_pilot(plan, "700"), 60)
    read = _counted(monkeypatch)
    report = track.poll(plan)
    assert _states(plan) == {"done": 6}, logs
    assert report.observed == 6 and len(read) == 6
    assert len(list((tmp_path / "out").glob("*.out"))) == 6   # placed by the poll that read the commits
    read.clear()
    (cursor,) = (plan / "queue" / "seen").iterdir()
    inode = cursor.stat().st_ino
    again = track.poll(plan)
    assert again.observed == 0 and read == [], "a second poll read the same commits again"
    assert cursor.stat().st_ino == inode, "a poll that moved nothing rewrote the cursor"


def test_a_cancel_and_a_claim_returned_after_a_fence_are_each_recorded(tmp_path, no_full_read):
    slow = ["/bin/sh", "-c", 'sleep 30; exec cp "$0" "$1"', "{input}", "{output}"]
    plan = _plan(tmp_path, _spec(tmp_path, 5, slow, jobs__pilot={"walltime": "00:10:00", "slots": 2,
                                                                "idle_release": "2s", "input_time": "60s"}))
    submit(plan)
    q = Queue(plan / "queue")
    pilot = _pilot(plan, "701")
    _claimed(q, 2)
    track.poll(plan)
    assert _states(plan) == {"submitted": 3, "running": 2}
    held = sorted(c.task for c in q.claims(("live",)))
    waiting = [f"{qid}_{i}" for qid, idx in q.waiting().items() for i in idx]
    q.cancel(waiting[:1])
    assert q.fence("701")
    _wait(pilot, 30)
    assert sorted(q.release()) == held
    track.poll(plan)
    assert _states(plan) == {"submitted": 4, "failed": 1}   # the two back to waiting; one cancelled
    assert track.poll(plan).observed == 0


def test_a_line_whose_commit_cannot_be_read_is_held_and_the_others_are_recorded_once(tmp_path, no_full_read):
    """A journal's line naming a task with no readable result (an NFS client's cached miss; a task the store has
    no submission for) is held: read again at every poll, while the lines before and after it are recorded
    once and the cursor moves past them."""
    plan = _plan(tmp_path, _spec(tmp_path, 3, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "702"), 60)
    q = Queue(plan / "queue")
    journal = next(q.d("results").iterdir())
    lines = journal.read_text().splitlines()
    ghost = lines[0].rpartition("_")[0] + "_77"
    journal.write_text("\n".join([lines[0], ghost, *lines[1:]]) + "\n")
    with open_plan_store(plan) as store:
        reader = store.location
    assert track.poll(plan).observed == 3 and _states(plan) == {"done": 3}
    held = [(journal.name, len(lines[0]) + 1, len(lines[0]) + len(ghost) + 2)]
    cursor = Cursor.load(q, reader)
    assert cursor.held == held and cursor.journals[journal.name] == journal.stat().st_size
    assert track.poll(plan).observed == 0 and _states(plan) == {"done": 3}
    assert Cursor.load(q, reader).held == held


def test_a_committed_token_still_listed_does_not_turn_its_end_back_to_running(tmp_path, no_full_read):
    """A pilot killed between its journal line and the unlink of its token: the end is recorded, and the token
    still in the pilot's directory is not taken for a claim."""
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "703"), 60)
    assert track.poll(plan).observed == 2
    q = Queue(plan / "queue")
    first = sorted(ledger.results(q.root))[0]   # folded by the poll that recorded it
    task = first[0]
    stale = q.d("live") / "704"
    stale.mkdir(parents=True)
    (stale / "info").write_text("n1\t2\t0\t\n")
    (stale / task).write_text("\t".join(first[:11]) + "\n")
    assert [c.task for c in q.claims(("live",))] == [task]
    assert track.poll(plan).observed == 0 and _states(plan) == {"done": 2}


def test_a_line_naming_a_task_the_store_did_not_take_is_read_again_alone(tmp_path):
    """``advance`` moves the cursor past the lines read, and holds a line whose task the store did not know or
    take (a submission recorded after its commit): that line alone is read again, and once it is taken nothing
    is read again."""
    plan = _plan(tmp_path, _spec(tmp_path, 3, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "702"), 60)
    q = Queue(plan / "queue")
    journal = next((q.d("results")).iterdir())
    lines = journal.read_text().splitlines()

    def describe(qid):
        return ("latelocal.tag", str(tmp_path / "out"))
    first = read_changes(q, (), "store", describe, "", 1)
    assert set(first.records) == set(lines)
    first.advance({lines[1]})
    assert Cursor.load(q, "store").journals[journal.name] == journal.stat().st_size
    second = read_changes(q, (), "store", describe, "", 1)
    assert set(second.records) == {lines[1]}     # the line not taken, alone
    second.advance(set())
    assert read_changes(q, (), "store", describe, "", 1).records == {}
    assert Cursor.load(q, "store").held == []


def test_a_held_line_starves_no_journal_and_every_line_is_read_within_bounded_reads(tmp_path):
    """With a read bounded to a few lines: a journal whose first line can never be read (its task unknown for
    good) and a busier journal listed first hold up no other line; each line is read, and recorded, once."""
    q = Queue(tmp_path / "queue")
    q.make()
    for task in [f"L1_{i}" for i in range(12)]:
        (q.d("done") / task).write_text("\t".join([task, "c", "p", "0", "n1", "1.0", "2.0", "0", "COMPLETED",
                                                   "0.1", "100", "placed"]) + "\n")
    (q.d("results") / "a").write_text("L1_99\n" + "".join(f"L1_{i}\n" for i in range(8)))   # L1_99: never readable
    (q.d("results") / "b").write_text("".join(f"L1_{i}\n" for i in range(8, 12)))

    def describe(qid):
        return ("tag", str(tmp_path / "out"))
    first = read_changes(q, (), "store", describe, "", 1, lines=4)
    assert {"L1_0", "L1_8"} <= set(first.records), first.records   # each journal its share, whatever the order
    assert sum(len(got) for got in first.lines.values()) == 4
    seen: list = []
    for _ in range(10):
        got = read_changes(q, (), "store", describe, "", 1, lines=3)
        seen += sorted(got.records)
        got.advance(set())
    assert sorted(seen) == sorted(f"L1_{i}" for i in range(12)), seen   # each once
    assert Cursor.load(q, "store").held == [("a", 0, 6)]


@pytest.mark.parametrize("throttle", [None, 3])
def test_a_large_late_bound_submission_is_claimed_and_enqueued_in_pieces(tmp_path, monkeypatch, no_full_read,
                                                                         throttle):
    """The submitter holds one piece's records at a time (issue 54: 10^6 inputs in one claim held 2.2 GB):
    an array above CLAIM_MAX goes as several claims, each its own submission in the queue, with a throttle
    too (it means nothing to pilots); every input is recorded once, and a pilot runs each once."""
    from hpcrun.operate.submission import batches

    monkeypatch.setattr(batches, "CLAIM_MAX", 4)
    extra = {"jobs__throttle": throttle} if throttle else {}
    plan = _plan(tmp_path, _spec(tmp_path, 10, ["/bin/cp", "{input}", "{output}"], **extra))
    report = submit(plan)
    assert [b.tasks for b in report.batches] == [4, 4, 2]
    assert len({b.job_id for b in report.batches}) == 3
    q = Queue(plan / "queue")
    assert sorted(len(ts) for ts in q.waiting().values()) == [2, 4, 4]
    assert _states(plan) == {"submitted": 10}
    _wait(_pilot(plan, "710"), 60)
    assert track.poll(plan).observed == 10
    assert _states(plan) == {"done": 10}
    assert len(list((tmp_path / "out").glob("*.out"))) == 10


def test_a_throttled_slurm_array_stays_one_submission():
    """``%N`` caps one array: cutting a throttled array in pieces would run N per piece."""
    from hpcrun.operate.results import ScriptInfo
    from hpcrun.operate.submission.batches import CLAIM_MAX, plan_batches

    script = ScriptInfo("jobs/a.sh", "0" * 64, 0, 2 * CLAIM_MAX + 9, True, None, 1)
    whole, _ = plan_batches([script], range(2 * CLAIM_MAX + 10), None, 5)
    assert [b.array_spec for b in whole] == [f"0-{2 * CLAIM_MAX + 9}%5"]
    cut, _ = plan_batches([script], range(2 * CLAIM_MAX + 10), None, None)
    assert [b.tasks for b in cut] == [CLAIM_MAX, CLAIM_MAX, 10]
    assert cut[1].array_spec == f"{CLAIM_MAX}-{2 * CLAIM_MAX - 1}"


def _paused_run(plan: Path, monkeypatch, job_id: str, interval: float, pilot_first: bool = False):
    """``hpcrun run`` for two rounds, a pilot started at the first (``pilot_first``: run to its end before); the
    pause's seconds counted, cut short once the 4 inputs are recorded done (seen after each read between rounds)."""
    import time

    from hpcrun.operate.supervision import supervise

    seen: dict = {"slept": 0, "done": 0, "observed": []}
    pilots: list = []

    if pilot_first:
        submit(plan)
        _wait(_pilot(plan, job_id), 60)

    def on_round(rnd):
        if not pilots and not pilot_first:
            pilots.append(_pilot(plan, job_id))
        seen["observed"].append(rnd.observed)

    def sleep(s):
        if seen["done"] < 4 and seen["slept"] < 60:
            time.sleep(s)
            seen["slept"] += 1

    real = supervise.Supervisor.between_rounds

    def between(self):
        end = real(self)
        seen["done"] = _states(plan).get("done", 0)
        return end
    monkeypatch.setattr(supervise.Supervisor, "between_rounds", between)
    report = supervise.run(plan, interval=interval, max_rounds=2, on_round=on_round, sleep=sleep)
    for pilot in pilots:
        _wait(pilot, 60)
    return report, seen


def test_the_supervisor_records_the_queue_between_its_polls(tmp_path, monkeypatch, no_full_read):
    """Late binding: while the supervisor pauses between two polls of the scheduler, it reads the queue every
    TICK_S and records what the pilots committed (a round then records a second's ends, not an interval's),
    and the next round counts them as changes (it does not slow down as if nothing happened)."""
    from hpcrun.operate.supervision import queue_reads

    monkeypatch.setattr(queue_reads, "TICK_S", 0.2)
    plan = _plan(tmp_path, _spec(tmp_path, 4, ["/bin/cp", "{input}", "{output}"]))
    report, seen = _paused_run(plan, monkeypatch, "720", 30)
    assert seen["done"] == 4, (seen, report.rounds[-1].summary())   # recorded by a read, before round 2
    assert seen["observed"][1] >= 4, seen   # the reads' records count as the second round's changes


def test_a_poll_reads_a_bounded_number_of_journal_lines_and_the_next_goes_on(tmp_path, monkeypatch, no_full_read):
    """What piled up (a first round that enqueued 10^6 inputs, a store outage) is recorded over several
    bounded reads: none is skipped, none recorded twice."""
    from hpcrun.backends.late import changes

    monkeypatch.setattr(changes, "LINES_PER_READ", 2)
    plan = _plan(tmp_path, _spec(tmp_path, 6, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "730"), 60)
    journal = sum(len(p.read_text().split()) for p in (plan / "queue" / "results").iterdir())
    assert journal == 6
    assert [track.poll(plan).observed for _ in range(4)] == [2, 2, 2, 0]
    assert _states(plan) == {"done": 6}


def test_a_full_read_between_polls_is_followed_at_once_by_the_next(tmp_path, monkeypatch, no_full_read):
    """What piled up is caught up at a read a second, not a read every TICK_S: a read that took as many lines
    as it could is followed by another at the next second of the pause."""
    from hpcrun.backends.late import changes
    from hpcrun.operate.supervision import queue_reads

    monkeypatch.setattr(queue_reads, "TICK_S", 4.0)
    monkeypatch.setattr(changes, "LINES_PER_READ", 1)
    plan = _plan(tmp_path, _spec(tmp_path, 4, ["/bin/cp", "{input}", "{output}"]))
    _report, seen = _paused_run(plan, monkeypatch, "740", 60, pilot_first=True)
    # the 4 commits in the journals before the first round, which reads 1: reads at 4, 5, 6 s (not 4, 8, 12)
    assert seen["done"] == 4 and seen["slept"] <= 8, seen


def test_the_end_is_seen_within_a_second_of_the_last_result(tmp_path, no_full_read):
    """The supervisor polls once a minute, but reads the queue every second: once what it read may have ended
    the campaign and the store says so, the next round comes at once and `hpcrun run` returns (issue 55)."""
    import time

    from hpcrun.operate.supervision import supervise

    plan = _plan(tmp_path, _spec(tmp_path, 4, ["/bin/cp", "{input}", "{output}"]))
    pilots: list = []

    def on_round(rnd):
        if not pilots:
            pilots.append(_pilot(plan, "750"))

    report = supervise.run(plan, interval=60, on_round=on_round, sleep=time.sleep, max_rounds=3)
    ended = time.time()
    _wait(pilots[0], 60)
    last = max(p.stat().st_mtime for p in (plan / "queue" / "results").iterdir())
    assert report.outcome == "finished" and len(report.rounds) == 2, report.rounds[-1].summary()
    assert ended - last < 5, f"the end was seen {ended - last:.1f} s after the last result"


def test_a_held_range_is_read_again_whole(tmp_path):
    """A held range that a read saw as one line (torn on a network filesystem) is read again as the lines it
    holds: none of them is lost behind the cursor, which is past them."""
    q = Queue(tmp_path / "queue")
    q.make()
    for task in ("L1_0", "L1_1"):
        (q.d("done") / task).write_text("\t".join([task, "c", "p", "0", "n1", "1.0", "2.0", "0", "COMPLETED",
                                                   "0.1", "100", "placed"]) + "\n")
    (q.d("results") / "a").write_text("L1_0\nL1_1\n")
    Cursor({"a": 10}, set(), [("a", 0, 10)]).save(q, "store")
    got = read_changes(q, (), "store", lambda qid: ("tag", str(tmp_path / "out")), "", 1)
    assert set(got.records) == {"L1_0", "L1_1"}
    got.advance(set())
    assert Cursor.load(q, "store").held == []


def test_the_queue_is_read_more_often_once_no_input_waits_and_only_for_a_while(monkeypatch):
    """Once every input left may be running (no more than the running pilots' slots), the end may come at any moment:
    the queue is read every FAST_TICK_S instead of every TICK_S, for at most FAST_FOR_S; the pause's slices follow.
    So too once those left would end before the next read at the pace the last read saw (issue 55)."""
    from types import SimpleNamespace

    from hpcrun.operate.supervision import queue_reads
    from hpcrun.operate.supervision.stopping import Stop

    now = [1000.0]
    monkeypatch.setattr(queue_reads.time, "monotonic", lambda: now[0])
    sup = SimpleNamespace(manifest=SimpleNamespace(pilots={"queue": "q"}), left=30, tick_ends=0, slots=24,
                          near_since=None, pace=0.0)
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S and sup.near_since is None   # 30 left, 24 slots
    sup.tick_ends = 10
    assert queue_reads.tick_s(sup) == queue_reads.FAST_TICK_S < queue_reads.TICK_S   # 20 left: none waits
    since = sup.near_since
    sup.slots = 0   # a round that could not count the pilots (an outage)
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S and sup.near_since == since   # the window goes on
    sup.tick_ends, sup.slots = 30, 24   # a read counted every end (failures to retry)
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S and sup.near_since == since
    sup.tick_ends, sup.slots = 10, 24
    now[0] += queue_reads.FAST_FOR_S - 1
    assert queue_reads.tick_s(sup) == queue_reads.FAST_TICK_S
    now[0] += 2
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S   # a last input of hours is not watched so
    sup.tick_ends = 0   # 30 left again (inputs returned): they wait for a slot, a new window when none does
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S and sup.near_since is None
    for left, ends, slots in ((20, 20, 24), (20, 0, 0)):   # nothing left; no pilot running
        sup.left, sup.tick_ends, sup.slots, sup.near_since = left, ends, slots, None
        assert queue_reads.tick_s(sup) == queue_reads.TICK_S
    sup.manifest.pilots = None   # array mode: no queue to read
    sup.left, sup.tick_ends, sup.slots = 20, 0, 24
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S
    sup.manifest.pilots, sup.slots = {"queue": "q"}, 24   # short inputs: 300 left, ending 400 a second
    sup.left, sup.tick_ends, sup.near_since, sup.pace = 700, 400, None, 400.0
    assert queue_reads.tick_s(sup) == queue_reads.FAST_TICK_S   # the next read at the last one's pace ends them
    sup.pace = 250.0
    assert queue_reads.tick_s(sup) == queue_reads.TICK_S and sup.near_since is None
    slept: list = []
    stop = Stop()
    stop.sleep(1.0, slept.append, lambda: False, lambda: 0.25)
    assert slept == [0.25] * 4


def test_a_read_of_the_queue_keeps_the_pace_of_the_ends_it_saw(monkeypatch):
    """The pace ``tick_s`` reads: the ends the reads recorded over a second or more. Reads 0.1-0.2 s apart (near
    the end) count into one window: alone, each would make its few ends look like a trickle."""
    from types import SimpleNamespace

    from hpcrun.operate.supervision import queue_reads

    now = [1000.0]
    got = [(5, 3, False)]
    monkeypatch.setattr(queue_reads.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(queue_reads, "record_queue", lambda *a: got[0])
    sup = SimpleNamespace(manifest=SimpleNamespace(pilots={"queue": "q"}), left=1000, tick_ends=0, slots=24,
                          near_since=None, ticked=0.0, tick_changes=0, pace_since=None, pace_ends=0, pace=0.0,
                          plan_dir="p", store=SimpleNamespace(any_in=lambda *a: True), campaign=SimpleNamespace(id=1),
                          folder=None)
    queue_reads.read(sup)
    assert sup.pace == 0.0 and sup.pace_since == 1000.0   # a first read: no pace yet
    now[0], got[0] = 1002.0, (300, 200, False)
    queue_reads.read(sup)
    assert sup.pace == 100.0 and sup.tick_ends == 203
    for at in (1002.2, 1002.4, 1002.6, 1002.8):   # reads every 0.2 s, 40 ends each: 200 a second
        now[0], got[0], sup.ticked = at, (40, 40, False), 0.0
        queue_reads.read(sup)
        assert sup.pace == 100.0   # the window is not a second long yet
    now[0], sup.ticked = 1003.0, 0.0
    queue_reads.read(sup)
    assert sup.pace == 200.0
