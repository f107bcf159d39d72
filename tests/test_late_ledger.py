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
    """A poll as the supervisor's round makes it: it folds (no other poll does)."""
    with open_plan_store(plan) as store:
        return track.poll_store(plan, read_manifest(plan, jobs=False), store, folder=Folder(str(plan / "run")),
                                fold_queue=True)


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
    assert list(q.d("done").iterdir()) == [], "a fold that failed was not tried again"
    assert sorted(r[0] for r in ledger.Ledgers(q.root).lines()) == _journaled(q)


def test_the_expected_input_time_is_read_from_folded_commits(tmp_path):
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/sh", "-c", 'sleep 3; exec cp "$0" "$1"', "{input}", "{output}"]))
    submit(plan)
    _wait(_pilot(plan, "802"), 60)
    q = Queue(plan / "queue")
    _poll(plan)
    assert list(q.d("done").iterdir()) == []
    q.write_expected(1000.0)
    assert 3 <= int((q.root / "expected").read_text()) < 10   # the inputs' own time, not the spec's 1000 s


def test_a_poll_other_than_the_supervisors_records_but_leaves_the_folding_to_it(tmp_path):
    """``hpcrun status`` (``--wait`` too) must not leave a ledger of its own: it records, and the supervisor's
    next round folds what it recorded."""
    plan = _done(tmp_path, 3)
    q = Queue(plan / "queue")
    assert track.poll(plan, folder=Folder(str(plan / "run"))).observed == 3 and _states(plan) == {"done": 3}
    assert sorted(p.name for p in q.d("done").iterdir()) == _journaled(q)
    assert not q.d(ledger.FOLDED).exists()
    assert _poll(plan).observed == 0
    assert list(q.d("done").iterdir()) == [] and len(list(q.d(ledger.FOLDED).iterdir())) == 1


# -- the queue alone (no pilot): what a review found ------------------------------------------------------------
def _queue(tmp_path: Path, n: int) -> Queue:
    q = Queue(tmp_path / "q")
    q.make()
    (q.d("arrays") / "L1").write_text(f"s.sh\t60\ttag\t0-{n - 1}\t\n")
    for i in range(n):
        (q.d("done") / f"L1_{i}").write_text(_line(f"L1_{i}"))
    (q.d("results") / "P").write_text("".join(f"L1_{i}\n" for i in range(n)))
    return q


def _line(task: str, mark: str = "placed") -> str:
    return "\t".join([task, "c" + task, "P", "0", "n1", "1.0", "2.0", "0", "COMPLETED", "1", "1", mark]) + "\n"


def test_a_store_that_has_folded_tasks_running_reads_them_committed_not_waiting(tmp_path):
    """Store A recorded and folded both commits; store B (restored from a backup, or a second one) has them
    running and reads one journal line this poll: the other is found in the ledgers, never made PENDING."""
    from hpcrun.backends.late.changes import read_changes
    q = _queue(tmp_path, 2)
    assert q.ledgers.fold("P", 0, 10) == 2 and list(q.d("done").iterdir()) == []
    got = read_changes(q, {"L1_0", "L1_1"}, "store-b", lambda qid: ("tag", ""), "None", 1, lines=1)
    assert {t: r.state for t, r in got.records.items()} == {"L1_0": "COMPLETED", "L1_1": "COMPLETED"}


def test_release_reads_done_before_the_ledgers_so_a_fold_between_the_two_is_seen(tmp_path, monkeypatch):
    """The fold writes the ledger, then removes done/: a release that looked at the ledgers first and at
    done/ after could miss a fold made in between (another process's), and run the input again."""
    q = _queue(tmp_path, 1)
    stale = q.d("fenced") / "P"   # the pilot killed between its journal line and its token's unlink
    stale.mkdir(parents=True)
    (stale / "L1_0").write_text(_line("L1_0")[:-len("\tplaced\n")] + "\n")
    real = ledger.Ledgers.committed_by

    def fold_meanwhile(self, pilot, tasks):
        ledger.Ledgers(q.root).fold("P", 0, 10)   # another process folds right now
        return real(self, pilot, tasks)
    monkeypatch.setattr(ledger.Ledgers, "committed_by", fold_meanwhile)
    assert q.release() == [] and not (q.d("ready") / "L1_0").exists()


def test_a_ledger_write_cut_short_loses_no_line_at_the_next_append(tmp_path, monkeypatch):
    """A write that fails half-way (a quota) keeps the done/ files; what it wrote is cut off, so the next fold's
    first line is not glued to it (and then lost with its done/ file removed)."""
    q = _queue(tmp_path, 2)
    real_fsync = ledger.os.fsync

    def full(fd):
        raise OSError(122, "Disk quota exceeded")
    monkeypatch.setattr(ledger.os, "fsync", full)
    assert q.ledgers.fold("P", 0, len("L1_0\n")) is None
    assert (q.d("done") / "L1_0").exists()
    monkeypatch.setattr(ledger.os, "fsync", real_fsync)
    [led] = list(q.d(ledger.FOLDED).iterdir())
    with open(led, "a") as f:   # and a crash's torn tail: half a line
        f.write(_line("L1_0")[:30])
    assert q.ledgers.fold("P", 0, 10) == 2 and list(q.d("done").iterdir()) == []
    assert sorted(r[0] for r in ledger.Ledgers(q.root).lines()) == ["L1_0", "L1_1"]
    assert q.result("L1_1", "P") == _line("L1_1").rstrip("\n").split("\t")
