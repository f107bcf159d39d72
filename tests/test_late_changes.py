"""A poll of a late-bound campaign reads what changed in the queue, not every task in flight (issue 54, part 3).

The real pilot (bash and the agent) claims and commits; ``hpcrun.operate.tracking.track.poll`` records
into a real SQLite store. The tests make the full read of the jobs in flight fail, so that a poll that
fell back to it would fail here, and count the commits a poll reads (``Queue.committed``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

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

    def committed(self, task, outputs, known=None):
        seen.append(task)
        return real(self, task, outputs, known)
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
    again = track.poll(plan)
    assert again.observed == 0 and read == [], "a second poll read the same commits again"
    assert list((plan / "queue" / "seen").iterdir()), "no cursor kept"


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


def test_a_line_whose_commit_cannot_be_read_holds_the_cursor_and_the_others_are_recorded_once(tmp_path, no_full_read):
    """A journal's line naming a task with no readable result (an NFS client's cached miss; a task the store has
    no submission for) holds the cursor there: read again at every poll, while the lines before and after it
    are recorded once."""
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
    assert Cursor.load(q, reader).journals[journal.name] == len(lines[0]) + 1
    assert track.poll(plan).observed == 0 and _states(plan) == {"done": 3}
    assert Cursor.load(q, reader).journals[journal.name] == len(lines[0]) + 1


def test_a_committed_token_still_listed_does_not_turn_its_end_back_to_running(tmp_path, no_full_read):
    """A pilot killed between its journal line and the unlink of its token: the end is recorded, and the token
    still in the pilot's directory is not taken for a claim."""
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/cp", "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "703"), 60)
    assert track.poll(plan).observed == 2
    q = Queue(plan / "queue")
    task = sorted(p.name for p in q.d("done").iterdir())[0]
    stale = q.d("live") / "704"
    stale.mkdir(parents=True)
    (stale / "info").write_text("n1\t2\t0\t\n")
    (stale / task).write_text((q.d("done") / task).read_text())
    assert [c.task for c in q.claims(("live",))] == [task]
    assert track.poll(plan).observed == 0 and _states(plan) == {"done": 2}


def test_the_cursor_stops_before_a_line_naming_a_task_the_store_did_not_take(tmp_path):
    """``advance`` moves the cursor past the lines recorded, and stops before the first line whose task the
    store did not know or take (a submission recorded after its commit): that line and those after it are read
    again, and once all are taken nothing is read again."""
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
    assert Cursor.load(q, "store").journals[journal.name] == len(lines[0]) + 1
    second = read_changes(q, (), "store", describe, "", 1)
    assert set(second.records) == set(lines[1:])     # read again from the line not taken on
    second.advance(set())
    assert read_changes(q, (), "store", describe, "", 1).records == {}
