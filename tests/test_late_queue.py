"""The bounded queue (issue 54, parts 1-2): the backlog's chunks, a claim's split cut short anywhere, enqueue in
O(submissions), withdrawal and cancel of waiting tasks, and a claim whose cost does not grow with the backlog.

Every "once" here is counted by walking the queue's files (each task's name or range, wherever it lies), not
from what the functions under test return.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import List

import pytest

from hpcrun.backends.late import layout as L
from hpcrun.backends.late.agent import Agent
from hpcrun.backends.late.queue import Queue


def _where(root: Path) -> Counter:
    """task -> how many places hold it: backlog chunks, ready/, withdrawn/, cancelled/, pilots' directories and
    splits in progress (a ``.take`` stands for its whole chunk; the task files and rest made beside it do not)."""
    seen: Counter = Counter()
    for dirpath, _dirs, files in os.walk(root):
        d = Path(dirpath)
        if d.name in ("arrays", "results", "done", "near", "cancel") or d.parent.name == "near":
            continue
        takes = {n[len(L.TAKE):]: _chunk(d / n, n[len(L.TAKE):]) for n in files if n.startswith(L.TAKE)}
        covered = set().union(*takes.values()) if takes else set()
        for name in files:
            if name.startswith(L.TAKE):
                seen.update(takes[name[len(L.TAKE):]])
            elif name.startswith(L.REST):
                if name[len(L.REST):] not in takes:
                    seen.update(_chunk(d / name, name[len(L.REST):]))
            elif "_" in name and "." not in name:
                seen.update([] if name in covered else [name])
            elif "." in name and not name.startswith("."):
                seen.update(_chunk(d / name, name))
    return +seen


def _chunk(path: Path, name: str) -> set:
    qid = name.rsplit(".", 1)[0]
    return {f"{qid}_{i}" for i in L.members(L.parse_ranges(L.read(path)))}


def _queue(tmp_path: Path, n: int) -> Queue:
    q = Queue(tmp_path / "queue")
    q.enqueue("L1", "script.sh", list(range(n)), 60, "tag")
    return q


def test_an_enqueue_writes_a_bounded_number_of_chunks_whatever_its_size(tmp_path):
    q = _queue(tmp_path, 100_000)
    assert len(os.listdir(q.d("backlog"))) == L.CHUNKS
    assert _where(q.root) == Counter({f"L1_{i}": 1 for i in range(100_000)})
    assert q.submission("L1")[3] == list(range(100_000))
    assert L.read(q.d("arrays") / "L1").split("\t")[3] == "0-99999"   # ranges, not 10^5 numbers


class Cut(Exception):
    """The claimant stopped here."""


def _cut_after(monkeypatch, stop_after: int) -> None:
    """The split's renames, unlinks and file creations each count a step; the claimant stops after the
    ``stop_after``-th (its file operations done, nothing after)."""
    calls = {"n": 0}

    def step(real):
        def wrapped(*a, **k):
            out = real(*a, **k)
            calls["n"] += 1
            if calls["n"] > stop_after:
                if hasattr(out, "close"):
                    out.close()
                raise Cut()
            return out
        return wrapped
    monkeypatch.setattr(L.os, "rename", step(os.rename))
    monkeypatch.setattr(L.os, "unlink", step(os.unlink))
    monkeypatch.setattr(L, "open", step(open), raising=False)


@pytest.mark.parametrize("stop_after", range(7))
def test_a_claims_split_cut_short_anywhere_is_settled_with_every_task_once(tmp_path, monkeypatch, stop_after):
    """The split stopped after each of its steps in turn (rename in, chunk read, rest made, task made, chunk let
    go, rest back), the claimant's directory then renamed away as the supervisor fences a pilot: every task stays in
    exactly one place, and release leaves no split behind."""
    q = _queue(tmp_path, 1000)   # chunks of 16: a split leaves a rest
    me = q.d("live") / "p1"
    me.mkdir(parents=True)
    name = sorted(os.listdir(q.d("backlog")))[0]
    _cut_after(monkeypatch, stop_after)
    try:
        got = L.split(q.d("backlog"), name, me, L.pick_first, lambda t: me / t)
        assert stop_after >= 6 and got == ["L1_0"]   # the split has six steps: the last one completes it
    except Cut:
        assert stop_after < 6
    monkeypatch.undo()
    every = Counter({f"L1_{i}": 1 for i in range(1000)})
    assert _where(q.root) == every
    assert q.waiting_count() == sum(map(len, q.waiting().values()))   # counted from the ranges, each task once
    assert q.fence("p1")
    q.release()
    assert _where(q.root) == every
    assert not [n for n in os.listdir(q.d("ended") / "p1") if n.startswith((L.TAKE, L.REST))]


def test_withdraw_and_cancel_take_waiting_tasks_only_and_each_once(tmp_path):
    q = _queue(tmp_path, 1000)
    me = q.d("live") / "p1"
    me.mkdir()
    claimed = L.split(q.d("backlog"), sorted(os.listdir(q.d("backlog")))[0], me, L.pick_first, lambda t: me / t)
    assert claimed == ["L1_0"]
    gone = q.withdraw([f"L1_{i}" for i in range(0, 1000, 3)])
    assert "L1_0" not in gone and len(gone) == len(range(3, 1000, 3))
    cancelled = {"L1_1", "L1_0"}
    q.cancel(cancelled)
    assert (q.d("cancel") / "L1_0").exists() and (q.d("cancelled") / "L1_1").exists()
    assert _where(q.root) == Counter({f"L1_{i}": 1 for i in range(1000)})
    assert q.in_state("withdrawn")["L1"] == {int(t.split("_")[1]) for t in gone}
    before = len(os.listdir(q.d("withdrawn")))
    whole = q.withdraw([f"L1_{i}" for i in range(1000)])   # the rest: whole chunks move as they are
    assert len(os.listdir(q.d("backlog"))) == 0 and len(whole) == 1000 - len(gone) - 2
    assert len(os.listdir(q.d("withdrawn"))) - before <= L.CHUNKS
    assert _where(q.root) == Counter({f"L1_{i}": 1 for i in range(1000)})


def test_an_enqueue_cut_short_is_published_once_by_repair(tmp_path, monkeypatch):
    q = Queue(tmp_path / "queue")
    real = os.rename
    n = {"k": 0}

    def rename(a, b):
        if "/backlog/." in str(a):
            n["k"] += 1
            if n["k"] > 5:
                raise KeyboardInterrupt()   # the submitting process killed after five chunks
        real(a, b)

    monkeypatch.setattr("hpcrun.backends.late.queue.os.rename", rename)
    with pytest.raises(KeyboardInterrupt):
        q.enqueue("L7", "s.sh", list(range(640)), 60, "tag")
    monkeypatch.setattr("hpcrun.backends.late.queue.os.rename", real)
    me = q.d("live") / "p"
    me.mkdir()
    L.split(q.d("backlog"), sorted(L.entries(q.d("backlog")))[0], me, L.pick_first, lambda t: me / t)
    assert q.repair() == 1 and q.repair() == 0
    assert _where(q.root) == Counter({f"L7_{i}": 1 for i in range(640)})


def _agent(q: Queue, tmp_path: Path) -> Agent:
    (q.d("live") / "p9").mkdir(parents=True, exist_ok=True)
    return Agent(q.root, "p9", "n1.example.org", 1, 1e12, 60, 10, 0, 5, 0, 1, "", tmp_path / "run")


def _ops_per_claim(q: Queue, tmp_path: Path, monkeypatch, claims: int = 20) -> Counter:
    counts: Counter = Counter()
    listed: List[int] = []
    for fn in ("rename", "link", "unlink", "listdir", "stat", "utime", "mkdir", "open", "replace", "scandir"):
        real = getattr(os, fn)

        def counted(*a, _real=real, _fn=fn, **k):
            counts[_fn] += 1
            out = _real(*a, **k)
            if _fn == "listdir":   # how many names a listing returned: a readdir costs by its entries too
                listed.append(len(out))
            return out
        monkeypatch.setattr(os, fn, counted)
    real_open = open

    def opened(*a, **k):
        counts["open"] += 1
        return real_open(*a, **k)
    monkeypatch.setattr("builtins.open", opened)
    agent = _agent(q, tmp_path)
    try:
        for _ in range(claims):
            assert agent._claim(1)
    finally:
        monkeypatch.undo()
    counts["most names listed"] = max(listed, default=0)
    return counts


def test_a_claim_costs_the_same_metadata_operations_at_a_million_waiting_as_at_a_hundred(tmp_path, monkeypatch):
    """Counted in the agent's own claims: every rename, link, unlink, listing, stat and open. A hundred waiting
    tasks make chunks of one or two (a claim writes no rest: a little cheaper)."""
    small = _ops_per_claim(_queue(tmp_path / "s", 100), tmp_path / "s", monkeypatch)
    mid = _ops_per_claim(_queue(tmp_path / "m", 10_000), tmp_path / "m", monkeypatch)
    big = _ops_per_claim(_queue(tmp_path / "b", 1_000_000), tmp_path / "b", monkeypatch)
    assert big["most names listed"] <= L.CHUNKS, big
    big.pop("most names listed"), mid.pop("most names listed"), small.pop("most names listed")
    assert big == mid and sum(small.values()) <= sum(big.values()) <= sum(small.values()) + 20, (small, big)
    assert sum(big.values()) / 20 <= 10, big


def test_the_agent_takes_its_nodes_hints_first_by_its_short_name(tmp_path):
    q = _queue(tmp_path, 50)
    q.hint({"L1_42": "n1"})
    assert (q.d("ready") / "L1_42").exists()
    assert _agent(q, tmp_path)._claim(1) == ["L1_42"]
    assert _where(q.root) == Counter({f"L1_{i}": 1 for i in range(50)})


SHIPPED = ("hpcrun.backends.late", "hpcrun_late_layout", "hpcrun.backends.late.runs", "hpcrun_late_runs",
           "hpcrun_late_direct")


def test_the_shipped_agent_and_protocol_import_the_standard_library_alone():
    """A compute node runs them without hpcrun: every import is the standard library's, or the protocol's copy."""
    import ast
    import sys

    import hpcrun.backends.late.agent as agent_mod
    import hpcrun.backends.late.direct as direct_mod
    import hpcrun.backends.late.runs as runs_mod
    for mod in (agent_mod, L, runs_mod, direct_mod):
        tree = ast.parse(Path(mod.__file__).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name in SHIPPED \
                    or top == "__future__", (mod.__name__, name)


def test_the_plans_shipped_agent_runs_where_hpcrun_is_not_installed(tmp_path):
    """The plan's bin/ copies as a node runs them: python3 without site-packages (no hpcrun), from another
    directory; each copy finds the others beside it."""
    import subprocess
    import sys

    from .test_late_binding import _plan, _spec
    plan = _plan(tmp_path, _spec(tmp_path, 2, ["/bin/true"]))
    ran = subprocess.run([sys.executable, "-S", "-I", str(plan / "bin" / "hpcrun-pilot.py"), "--help"], cwd="/",
                         capture_output=True, text=True)
    assert ran.returncode == 0 and "--queue" in ran.stdout, ran.stdout + ran.stderr
    gone = subprocess.run([sys.executable, "-S", "-I", "-c", "import hpcrun"], cwd="/", capture_output=True)
    assert gone.returncode != 0   # the probe ran without hpcrun, not against the installed package


def test_a_late_plan_is_one_submission_whatever_the_sites_array_size(tmp_path):
    """1,500 inputs on a site whose MaxArraySize is 1001: array mode cuts two arrays, a late-bound plan one queue
    submission (the backlog then stays at its bounded number of chunks)."""
    import yaml

    from hpcrun.plan.load import load_plan

    from .test_late_binding import COPY, _spec
    data = _spec(tmp_path, 1500, COPY)
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(data))
    late = load_plan(tmp_path / "campaign.yaml")
    data["jobs"]["binding"] = "array"
    data["jobs"].pop("pilot")
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(data))
    early = load_plan(tmp_path / "campaign.yaml")
    assert early.profile.max_array_size == 1001 and len(early.scripts) == 2
    assert len(late.scripts) == 1 and len(late.scripts[0].jobs) == 1500


def test_a_withdrawal_racing_a_pilots_split_never_takes_the_task_the_pilot_claimed(tmp_path, monkeypatch):
    """The supervisor glanced at a chunk (every task wanted), then a pilot split it (claiming its first task and
    putting the rest back) before the supervisor took it: the withdrawal names only what it moved, the pilot's
    task stays the pilot's, and every task is in one place."""
    q = _queue(tmp_path, 1000)
    me = q.d("live") / "p1"
    me.mkdir()
    real_take = L.take
    raced: List[str] = []

    def take(backlog, name, hold):
        if not raced and hold.parent.name == ".hold":   # the supervisor's take: a pilot splits the chunk first
            raced.extend(L.cut(backlog, name, me, real_take(backlog, name, me), L.pick_first, lambda t: me / t))
        return real_take(backlog, name, hold)

    monkeypatch.setattr(L, "take", take)
    gone = q.withdraw([f"L1_{i}" for i in range(1000)])
    monkeypatch.undo()
    assert raced and raced[0] not in gone and (me / raced[0]).exists(), (raced, len(gone))
    assert len(gone) == 999
    assert _where(q.root) == Counter({f"L1_{i}": 1 for i in range(1000)})


def test_every_task_has_a_record_while_its_chunk_is_in_a_split(tmp_path):
    """A pilot holds a chunk mid-split (renamed out of the backlog): the supervisor's reading still finds each of
    its tasks waiting, none missing (a task missing from a reading would be called LOST and run again)."""
    from .test_late_binding import COPY, _enqueue, _pilots, _plan, _spec
    plan = _plan(tmp_path, _spec(tmp_path, 200, COPY))
    qid = _enqueue(plan, 200)
    q = Queue(plan / "queue")
    me = q.d("live") / "p1"
    me.mkdir(parents=True)
    name = sorted(L.entries(q.d("backlog")))[0]
    assert L.take(q.d("backlog"), name, me)
    (q.d(".hold") / "x").mkdir(parents=True)   # and the supervisor's own split of another, cut short
    other = sorted(L.entries(q.d("backlog")))[0]
    assert L.take(q.d("backlog"), other, q.d(".hold") / "x")
    records = _pilots(plan).records([qid], "", in_flight={f"{qid}_{i}" for i in range(200)})
    assert len(records) == 200 and {r.state for r in records.values()} == {"PENDING"}
    assert q.waiting_count() == 200


def test_a_job_reads_its_rows_where_the_index_says_not_by_a_scan(tmp_path):
    """tasks.idx gives each job the byte offset of its rows: the job script's task_rows reads them there (a row
    planted at the head of tasks.tsv for the same job, which a scan would find, is not read), and falls back to
    the scan when the index is absent."""
    import subprocess

    from .test_late_binding import COPY, _plan, _spec
    data = _spec(tmp_path, 7, COPY)
    data["jobs"]["files_per_job"] = 2
    plan = _plan(tmp_path, data)
    tasks, index = plan / "tasks.tsv", plan / "tasks.idx"
    rows = tasks.read_text()
    script = next((plan / "jobs").glob("*")).read_text()
    start = script.index("task_rows() {")
    fn = script[start:script.index("\n}\n", start) + 3]
    want = {}
    for line in rows.splitlines():
        want.setdefault(int(line.split("\t")[0]), []).append(line)
    planted = "\t".join([str(max(want)), "fake"] + ["x"] * 7) + "\n"
    tasks.write_text(planted + rows)   # every offset moves by the planted row's bytes
    index.write_text("".join(f"{int(o) + len(planted):020d}\n" for o in index.read_text().split()))

    def read(i: int) -> List[str]:
        out = subprocess.run(["bash", "-c", fn + f'\ntask_rows {i}'], env={"HPCRUN_PLAN_DIR": str(plan),
                             "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    for i, lines in want.items():
        assert read(i) == lines, (i, read(i))
    index.unlink()
    assert read(max(want)) == [planted.rstrip("\n")] + want[max(want)]   # the scan finds the planted row too


def test_a_campaign_enqueued_in_many_pieces_keeps_the_backlog_small(tmp_path):
    """A 10^6 campaign goes as 50 submissions: the backlog a claim lists stays well under 1,000 files."""
    q = Queue(tmp_path / "queue")
    for k in range(50):
        q.enqueue(f"L{k}", "script.sh", list(range(1000)), 60, "tag")
    assert len(os.listdir(q.d("backlog"))) <= L.BACKLOG_MAX + 50 * L.MIN_CHUNKS
    assert q.waiting_count() == 50_000
    assert sum(len(ts) for ts in q.waiting().values()) == 50_000
