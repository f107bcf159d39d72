"""Late binding's commits folded out of ``queue/done/`` once a poll recorded them (issue 56, ledger.py).

The real pilot (bash and the agent) claims and commits; ``track.poll`` records into a real SQLite store and
folds. Each test reads what it checks from a source the fold does not write: the store, the outputs, the
agent's journal.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrun.backends.late import ledger
from hpcrun.backends.late.changes import Cursor
from hpcrun.backends.late.figures import figures
from hpcrun.backends.late.queue import Queue
from hpcrun.operate.manifest import read_manifest
from hpcrun.operate.outputs.folding import Folder
from hpcrun.operate.plandir import open_plan_store, scheduler_of
from hpcrun.operate.submission.submit import submit
from hpcrun.operate.tracking import track

from .test_late_binding import _pilot, _plan, _spec, _wait

pytestmark = pytest.mark.usefixtures("fake_slurm")
COPY = ["/bin/cp", "{input}", "{output}"]


def _states(plan: Path) -> dict:
    with open_plan_store(plan) as store:
        cid = store.get_campaign("latelocal").id
        return {s: n for s, n in store.counts_by_state(cid).items() if n}


def _journaled(q: Queue) -> list:
    """The tasks the agent's journals name (the agent writes them, the fold never does)."""
    return sorted(t for p in q.d("results").iterdir() for t in p.read_text().split())


def _poll(plan: Path):
    """A poll as the supervisor makes it: with a folder held across its polls (a one-shot poll folds nothing)."""
    return track.poll(plan, folder=Folder(str(plan / "run")))


def _done(tmp_path: Path, n: int) -> Path:
    plan = _plan(tmp_path, _spec(tmp_path, n, COPY))
    submit(plan)
    _wait(_pilot(plan, "801"), 60)
    return plan


def test_a_recorded_commit_leaves_done_and_is_read_from_the_ledger(tmp_path):
    plan = _done(tmp_path, 4)
    q = Queue(plan / "queue")
    assert len(list(q.d("done").iterdir())) == 4           # committed, nothing recorded yet
    assert _poll(plan).observed == 4 and _states(plan) == {"done": 4}
    assert list(q.d("done").iterdir()) == [], "a recorded commit stayed a file"
    [led] = list(q.d(ledger.FOLDED).iterdir())
    assert led.name.startswith("801@")
    tasks = _journaled(q)
    assert sorted(r[0] for r in ledger.results(q.root)) == tasks
    assert all(r[11] == "placed" for r in ledger.results(q.root))
    assert len(list((tmp_path / "out").glob("*.out"))) == 4
    # a reader that asks of every task by name (status's queue view) finds each one ended, none waiting
    manifest = read_manifest(plan)
    sched = scheduler_of(manifest)
    qid = tasks[0].rpartition("_")[0]
    records = sched.records([qid], "")
    assert sorted(records) == tasks and {r.state for r in records.values()} == {"COMPLETED"}
    # the poll after reads nothing again and finds no file to fold
    assert _poll(plan).observed == 0 and _states(plan) == {"done": 4}
    assert figures(q.root, plan / "run", 1)["inputs_run"] == 4


def test_a_second_store_with_no_cursor_reads_the_folded_commits_by_their_journal(tmp_path):
    """A cursor lost (or a store that never read this queue) reads every journal line again: each commit is
    found in the ledgers of the journal naming it."""
    plan = _done(tmp_path, 3)
    q = Queue(plan / "queue")
    _poll(plan)
    assert list(q.d("done").iterdir()) == []
    with open_plan_store(plan) as store:
        reader = store.location
    os.unlink(Cursor.path(q, reader))
    read = scheduler_of(read_manifest(plan)).changes([], reader)
    assert sorted(read.records) == _journaled(q) and not read.unread
    assert {r.state for r in read.records.values()} == {"COMPLETED"}


def test_a_fenced_pilots_leftover_token_of_a_folded_commit_is_not_run_again(tmp_path):
    """A pilot killed between its journal line and its token's unlink leaves the token; once the commit was
    folded no done/ file is left to say it committed: release reads the pilot's ledger and returns nothing."""
    plan = _done(tmp_path, 2)
    q = Queue(plan / "queue")
    _poll(plan)
    first = sorted(ledger.results(q.root))[0]
    task = first[0]
    stale = q.d("live") / "801"   # the pilot's directory as the kill left it: the token holds its result line
    stale.mkdir(parents=True)
    (stale / "info").write_text("n1\t2\t0\t\n")
    (stale / task).write_text("\t".join(first[:11]) + "\n")
    assert q.fence("801")
    assert q.release() == [], "a folded commit went back to the queue: its input would run twice"
    assert not (q.d("ready") / task).exists()
    assert _poll(plan).observed == 0 and _states(plan) == {"done": 2}


def test_a_fold_that_cannot_be_written_keeps_every_done_file(tmp_path, monkeypatch):
    plan = _done(tmp_path, 3)
    q = Queue(plan / "queue")

    def no_sync(fd):
        raise OSError(122, "Disk quota exceeded")
    monkeypatch.setattr(ledger.os, "fsync", no_sync)
    assert _poll(plan).observed == 3 and _states(plan) == {"done": 3}
    assert sorted(p.name for p in q.d("done").iterdir()) == _journaled(q)
    monkeypatch.undo()
    assert _poll(plan).observed == 0   # kept as files, read as before: nothing is recorded twice
    assert sorted(r[0] for r in ledger.results(q.root)) == _journaled(q)


def test_the_expected_input_time_is_read_from_folded_commits(tmp_path):
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/sh", "-c", 'sleep 3; exec cp "$0" "$1"', "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "802"), 60)
    q = Queue(plan / "queue")
    _poll(plan)
    assert list(q.d("done").iterdir()) == []
    q.write_expected(1000.0)
    assert 3 <= int((q.root / "expected").read_text()) < 10   # the inputs' own time, not the spec's 1000 s


def test_a_one_shot_poll_records_but_leaves_the_folding_to_the_supervisor(tmp_path):
    """``hpcrun status`` run every few seconds must not leave a ledger of its own each time: it records, and
    the next poll of a process that polls on (the supervisor) folds what it recorded."""
    plan = _done(tmp_path, 3)
    q = Queue(plan / "queue")
    assert track.poll(plan).observed == 3 and _states(plan) == {"done": 3}
    assert sorted(p.name for p in q.d("done").iterdir()) == _journaled(q)
    assert not q.d(ledger.FOLDED).exists()
    assert _poll(plan).observed == 0
    assert list(q.d("done").iterdir()) == [] and len(list(q.d(ledger.FOLDED).iterdir())) == 1
