"""Successful runs' directories folded into tar segments (issue 56): read back whole, by hpcrun and by tar,
never lost in the middle of a fold, and read by the report as if they were directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace
from typing import Dict

import pytest

from hpcrun.operate.outputs import folding
from hpcrun.report import gather


def _run(run_dir: Path, job: str, run_id: str, files: Dict[str, bytes]) -> Path:
    where = run_dir / job / run_id
    (where / "chains").mkdir(parents=True)
    for rel, data in {"exit_code": b"0\n", **files}.items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_bytes(data)
    return where


def _dirs(*paths: str) -> list:
    return [(p, None) for p in paths]


FILES = {"inputs.tsv": b"0\treco.00001\t1\t/in/a.raw\n", "chains.tsv": b"0\t0\tok\n", "chains/0.rc": b"0\n",
         "chains/0.log": b"x" * 5000 + b"\nend\n", "exit_code": b"0\n", "outputs.tsv": b""}


def test_a_folded_run_leaves_no_directory_and_reads_back_whole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "101", FILES)
    b = _run(run_dir, "reco.00002", "102", {"chains.tsv": b"0\t0\tok\n"})
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a), str(b))) == 2
    folder.close()
    assert not a.exists() and not (run_dir / "reco.00001").exists(), "the run directory and its job's stayed"
    assert sorted(os.listdir(run_dir / folding.FOLDED))[0].endswith(".idx")
    (found,) = folding.find(str(run_dir), "reco.00001")
    assert found.run_id == "101"
    assert folding.read_run(found) == FILES
    assert folding.read_run(folding.find(str(run_dir), "reco.00002")[0]) == {"chains.tsv": b"0\t0\tok\n",
                                                                            "exit_code": b"0\n"}


def test_plain_tar_lists_and_restores_a_folded_run(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("no tar on this machine")
    run_dir = tmp_path / "run"
    folder = folding.Folder(str(run_dir))
    folder.fold(_dirs(str(_run(run_dir, "reco.00001", "101", FILES)), str(_run(run_dir, "reco.00002", "7", FILES))))
    folder.close()
    (segment,) = (run_dir / folding.FOLDED).glob("*.tar")
    listed = subprocess.run(["tar", "-tf", str(segment)], capture_output=True, text=True, check=True).stdout
    assert "reco.00001/101/chains/0.log" in listed.splitlines() and "reco.00002/7/exit_code" in listed.splitlines()
    subprocess.run(["tar", "-xf", str(segment), "-C", str(run_dir), "reco.00001/101"], check=True)
    for rel, data in FILES.items():
        assert (run_dir / "reco.00001" / "101" / rel).read_bytes() == data


def test_a_failed_sync_keeps_every_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order of a fold: members synced, index synced, only then a directory removed."""
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "101", FILES)
    calls = []

    def fsync(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        if calls[-1].endswith(".idx"):   # the index's sync, after the segment's
            assert any(c.endswith(".tar") for c in calls), "the index was synced before the members"
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(folding.os, "fsync", fsync)
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a))) == 0
    assert sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()) == sorted(FILES)
    assert folding.find(str(run_dir), "reco.00001") == [], "an index line that was not synced was read"
    monkeypatch.undo()
    assert folder.fold(_dirs(str(a))) == 1 and not a.exists()
    assert folding.read_run(folding.find(str(run_dir), "reco.00001")[0]) == FILES


def test_a_directory_that_is_not_a_plain_record_is_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "101", FILES)
    os.symlink("/etc/hostname", a / "link")
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a))) == 0 and (a / "chains.tsv").exists()


def test_two_folders_write_segments_of_their_own(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    one, two = folding.Folder(str(run_dir)), folding.Folder(str(run_dir))
    one.fold(_dirs(str(_run(run_dir, "reco.00001", "1", FILES))))
    two.fold(_dirs(str(_run(run_dir, "reco.00002", "2", FILES))))
    one.fold(_dirs(str(_run(run_dir, "reco.00003", "3", FILES))))
    assert len(list((run_dir / folding.FOLDED).glob("*.tar"))) == 2
    assert sorted(r.job for r in folding.indexed(str(run_dir))) == ["reco.00001", "reco.00002", "reco.00003"]
    for r in folding.indexed(str(run_dir)):
        assert folding.read_run(r) == FILES


def test_bytes_past_the_index_are_never_read(tmp_path: Path) -> None:
    """A crash between the members and their index leaves bytes the index does not name: a later fold by the
    same process writes over them, and readers stop where each run's length says."""
    run_dir = tmp_path / "run"
    folder = folding.Folder(str(run_dir))
    folder.fold(_dirs(str(_run(run_dir, "reco.00001", "1", FILES))))
    (segment,) = (run_dir / folding.FOLDED).glob("*.tar")
    with open(segment, "ab") as f:
        f.write(tarfile.TarInfo("reco.00009/9/chains.tsv").tobuf(format=tarfile.PAX_FORMAT))
    assert [r.job for r in folding.indexed(str(run_dir))] == ["reco.00001"]
    folder.fold(_dirs(str(_run(run_dir, "reco.00002", "2", {"chains.tsv": b"0\t1\tfailed\n"}))))
    names = [n for n, _ in folding.matching(str(run_dir), "*/*/chains.tsv")]
    assert names == ["reco.00001/1/chains.tsv", "reco.00002/2/chains.tsv"]


class _Slurm:
    def job_logs(self, name, job_id, index):
        return [f"{name}-{job_id}_{index}.out", f"{name}-{job_id}.out"]


def _poller(plan: Path, sched=None) -> SimpleNamespace:
    first = SimpleNamespace(sched=sched or object())
    return SimpleNamespace(run_dir=str(plan / "run"), plan_dir=plan, clusters={None: first}, first=first,
                           job_dir=lambda a, raw: f"{plan}/run/{a.job_name}/{raw}")


def test_only_runs_seen_to_complete_are_folded_with_their_scheduler_logs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok, bad = _run(run_dir, "reco.00001", "11", FILES), _run(run_dir, "reco.00002", "12", FILES)
    (tmp_path / "logs").mkdir()
    for i in (1, 2):
        (tmp_path / "logs" / f"reco.tag-10_{i}.out").write_text(f"job {i} said this\n")
    subs = [SimpleNamespace(id=i, job_name=f"reco.0000{i}", job_id="10", array_index=i, cluster=None) for i in (1, 2)]
    changes = [SimpleNamespace(submission_id=1, slurm_state="COMPLETED"),
               SimpleNamespace(submission_id=2, slurm_state="FAILED")]
    assert folding.fold_completed(None, _poller(tmp_path, _Slurm()), changes,
                                  [(subs[0], "11"), (subs[1], "12")]) == 1
    assert not ok.exists() and (bad / "chains" / "0.log").exists(), "a failed run's directory must stay whole"
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["reco.tag-10_2.out"], "only the folded log goes"
    (found,) = folding.find(str(run_dir), "reco.00001")
    assert folding.read_run(found) == {**FILES, folding.SCHEDULER_LOG: b"job 1 said this\n"}


def test_late_bound_inputs_fold_without_a_log_of_their_own(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok = _run(run_dir, "reco.00001", "701.3.9", FILES)
    sub = SimpleNamespace(id=1, job_name="reco.00001", job_id="L17", array_index=0, cluster=None)
    assert folding.fold_completed(None, _poller(tmp_path), [SimpleNamespace(submission_id=1,
                                  slurm_state="COMPLETED")], [(sub, "701.3.9")]) == 1
    assert not ok.exists() and folding.read_run(folding.find(str(run_dir), "reco.00001")[0]) == FILES


def test_the_report_reads_folded_records_once(tmp_path: Path) -> None:
    """chains.tsv of a folded run counts as a directory's does; a run in both places counts once."""
    plan = tmp_path
    run_dir = plan / "run"
    folder = folding.Folder(str(run_dir))
    folder.fold(_dirs(str(_run(run_dir, "reco.00001", "1", {"chains.tsv": b"0\t0\tok\n1\t137\tkilled\n"}))))
    _run(run_dir, "reco.00002", "2", {"chains.tsv": b"0\t1\tfailed\n"})
    twice = _run(run_dir, "reco.00003", "3", {"chains.tsv": b"0\t0\tok\n"})
    shutil.copytree(twice, tmp_path / "copy")
    folder.fold(_dirs(str(twice)))
    shutil.copytree(tmp_path / "copy", twice)   # a crash after the index, before the removal
    assert gather._chain_endings(plan) == {"ok": 2, "killed": 1, "failed": 1}


def test_a_run_whose_exit_code_is_not_0_is_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    bad, none = _run(run_dir, "reco.00001", "1", {"exit_code": b"137\n"}), _run(run_dir, "reco.00002", "2", {})
    (none / "exit_code").unlink()
    assert folding.Folder(str(run_dir)).fold(_dirs(str(bad), str(none))) == 0
    assert (bad / "exit_code").exists() and (none / "chains").is_dir()


def test_a_full_segment_rotates_between_folds_never_within_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folding, "SEGMENT_MAX", 5000)
    run_dir = tmp_path / "run"
    folder = folding.Folder(str(run_dir))
    for batch in range(3):
        runs = [str(_run(run_dir, f"reco.{batch}{k}", "1", FILES)) for k in range(3)]
        assert folder.fold(_dirs(*runs)) == 3
    assert len(list((run_dir / folding.FOLDED).glob("*.tar"))) == 3
    found = list(folding.indexed(str(run_dir)))
    assert len(found) == 9 and all(folding.read_run(r) == FILES for r in found)


def test_a_filesystem_that_refuses_keeps_every_directory_and_the_next_fold_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full quota (EDQUOT) at the segment's creation, or in the middle of a run's copy: the directories not
    written whole stay, the folder is not wedged, and what a later fold writes reads back."""
    run_dir = tmp_path / "run"
    folder = folding.Folder(str(run_dir))
    real_open = folding.os.open
    monkeypatch.setattr(folding.os, "open", lambda *a, **k: (_ for _ in ()).throw(OSError(122, "Disk quota")))
    a = _run(run_dir, "reco.00001", "1", FILES)
    assert folder.fold(_dirs(str(a))) == 0 and (a / "chains" / "0.log").exists()
    monkeypatch.setattr(folding.os, "open", real_open)
    real_copy, copies = folding._copy, []

    def copy(path: str, size: int, out) -> None:
        copies.append(path)
        if "reco.00002" in path and path.endswith("0.log"):
            out.write(b"half")
            raise OSError(122, "Disk quota exceeded")
        real_copy(path, size, out)

    monkeypatch.setattr(folding, "_copy", copy)
    b, c = _run(run_dir, "reco.00002", "2", FILES), _run(run_dir, "reco.00003", "3", FILES)
    assert folder.fold(_dirs(str(a), str(b), str(c))) == 2   # the run cut short stays; the next is written over it
    assert not a.exists() and (b / "chains" / "0.log").exists() and not c.exists()
    monkeypatch.setattr(folding, "_copy", real_copy)
    assert folder.fold(_dirs(str(b))) == 1
    assert {r.job: folding.read_run(r) == FILES for r in folding.indexed(str(run_dir))} == {
        "reco.00001": True, "reco.00002": True, "reco.00003": True}


def test_an_end_without_a_job_id_folds_nothing(tmp_path: Path) -> None:
    """An array task ended with no id from the accounting: its job's directory is not a run's."""
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "1", FILES)
    sub = SimpleNamespace(id=1, job_name="reco.00001", job_id="5", array_index=None, cluster=None)
    assert folding.fold_completed(None, _poller(tmp_path),
                                  [SimpleNamespace(submission_id=1, slurm_state="COMPLETED")], [(sub, "")]) == 0
    assert a.exists()


def test_logs_show_a_run_folded_or_not_and_both_after_a_crash(tmp_path: Path) -> None:
    from hpcrun.operate.outputs import runlogs
    run_dir = tmp_path / "run"
    folder = folding.Folder(str(run_dir))
    folder.fold(_dirs(str(_run(run_dir, "reco.00001", "1", FILES))))
    _run(run_dir, "reco.00001", "2", {"reason": b"chain(s) failed: 0(rc=7)\n", "exit_code": b"7\n"})
    half = _run(run_dir, "reco.00001", "3", FILES)
    folder.fold(_dirs(str(half)))
    (half / "chains").mkdir(parents=True)   # a crash while the directory was removed: chains/ only was left
    folded = {r.run_id: r for r in folding.find(str(run_dir), "reco.00001")}
    runs = {r.run_id: r for r in runlogs._runs(run_dir, "reco.00001", folded)}
    assert runs["1"].folded and runs["1"].files["chains/0.log"].endswith("end\n")
    assert not runs["2"].folded and runs["2"].files["reason"].startswith("chain(s) failed")
    assert runs["3"].files["chains/0.log"] == FILES["chains/0.log"].decode(), "the folded copy was hidden"


def test_a_claims_section_of_its_slot_log(tmp_path: Path) -> None:
    from hpcrun.backends.late.runs import CLAIM_HEADER
    from hpcrun.operate.outputs import runlogs
    log = tmp_path / "run" / "pilots" / "77" / "claims" / "3.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"{CLAIM_HEADER}77.3.0 77.3.1\nfirst said\n{CLAIM_HEADER}77.3.2\nsecond said\n")
    assert runlogs.claim_log(tmp_path, "77.3.1")[1] == f"{CLAIM_HEADER}77.3.0 77.3.1\nfirst said\n"
    assert runlogs.claim_log(tmp_path, "77.3.2")[1] == f"{CLAIM_HEADER}77.3.2\nsecond said\n"
    assert runlogs.claim_log(tmp_path, "77.3.9")[1] == ""


@pytest.mark.parametrize("name,kind,size,mtime", [
    ("reco.00001/11229.4.468/chains/0.timeline", tarfile.REGTYPE, 123, 1796007603),
    ("reco.00001/11229.4.468", tarfile.DIRTYPE, 0, 1796007603),
    ("x" * 100, tarfile.REGTYPE, 0, 0),                  # the longest name a ustar block holds
    ("d" * 99, tarfile.DIRTYPE, 0, 5),                   # ... with the "/" tar adds to a directory's
    ("d" * 100, tarfile.DIRTYPE, 0, 5),                  # ... which makes it one too long: tarfile's
    ("early", tarfile.REGTYPE, 1, -1),                   # a time before 1970: the same
    ("late", tarfile.REGTYPE, 1, 8 ** 11),               # past the time field's digits: the same
    ("y" * 101, tarfile.REGTYPE, 1, 1),                  # longer: tarfile's extended header
    ("r\u00e9co/1/exit_code", tarfile.REGTYPE, 2, 1),   # not ASCII: the same
    ("big", tarfile.REGTYPE, 8 ** 11, 1),                # past the size field's 11 octal digits
])
def test_a_members_header_is_the_one_tarfile_writes(name: str, kind: bytes, size: int, mtime: int) -> None:
    """The fold builds a short ASCII member's header itself (tarfile's cost most of a fold's CPU): byte for byte
    what tarfile's PAX format writes, and tarfile's own for any other member."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime, info.mode = kind, size, mtime, 0o755 if kind == tarfile.DIRTYPE else 0o644
    assert folding.header(info) == info.tobuf(format=tarfile.PAX_FORMAT)


def test_a_member_with_an_owner_or_of_another_type_gets_tarfiles_header() -> None:
    owned = tarfile.TarInfo("a/b")
    owned.uid, owned.uname = 1000, "u"
    link = tarfile.TarInfo("a/c")
    link.type, link.linkname = tarfile.SYMTYPE, "b"
    fraction = tarfile.TarInfo("a/d")
    fraction.mtime = 1796007603.7   # tarfile rounds it, and keeps it exact in an extended header
    for info in (owned, link, fraction):
        assert folding.header(info) == info.tobuf(format=tarfile.PAX_FORMAT)


def test_a_run_with_a_long_or_foreign_name_folds_and_reads_back(tmp_path: Path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("no tar on this machine")
    run_dir = tmp_path / "run"
    job = "r\u00e9co-" + "j" * 120
    mixed = {**FILES, "chains/" + "l" * 110 + ".log": b"long\n"}   # short names beside one too long
    a = _run(run_dir, job, "101", FILES)
    b = _run(run_dir, "reco.00002", "102", mixed)
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a), str(b))) == 2
    folder.close()
    assert folding.read_run(folding.find(str(run_dir), job)[0]) == FILES
    assert folding.read_run(folding.find(str(run_dir), "reco.00002")[0]) == mixed
    (segment,) = (run_dir / folding.FOLDED).glob("*.tar")
    subprocess.run(["tar", "-xf", str(segment), "-C", str(run_dir)], check=True)
    assert (run_dir / job / "101" / "chains" / "0.log").read_bytes() == FILES["chains/0.log"]
    for rel, data in mixed.items():
        assert (run_dir / "reco.00002" / "102" / rel).read_bytes() == data


def test_a_folded_run_goes_by_its_members_and_what_came_after_its_listing_goes_too(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """The directory is removed by what was folded of it (an unlink a file, a rmdir a directory: no rmtree walk,
    whose calls are a metadata server's each); a file that appeared after the listing is removed as before."""
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "101", FILES)
    b = _run(run_dir, "reco.00002", "102", FILES)
    calls: Dict[str, int] = {"unlink": 0, "rmdir": 0}

    class Counted:   # folding's os alone (shutil's rmtree keeps the real one)
        def __getattr__(self, name):
            real = getattr(os, name)
            if name not in calls:
                return real

            def counted(*args, **kw):
                calls[name] += 1
                return real(*args, **kw)
            return counted
    monkeypatch.setattr(folding, "os", Counted())
    synced = folding.Folder._sync

    def late_writer(self, written):
        (b / "chains" / "late.log").write_bytes(b"after the listing\n")   # b's rmdir of chains/ fails: rmtree
        return synced(self, written)
    monkeypatch.setattr(folding.Folder, "_sync", late_writer)
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a), str(b))) == 2
    folder.close()
    assert not a.exists() and not b.exists() and not (run_dir / "reco.00002").exists()
    # a: its 6 files, 2 directories and run/reco.00001/; b: its files, chains/ that would not go, its job's
    assert calls == {"unlink": 2 * len(FILES), "rmdir": 2 + 1 + 1 + 1}, calls   # b: chains/ would not go
    assert folding.read_run(folding.find(str(run_dir), "reco.00001")[0]) == FILES


def test_a_folded_runs_directory_swapped_for_a_link_after_its_listing_is_not_followed(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """What is removed is removed through the run's own directories, never through a link put in place of one
    since the listing (as rmtree does): the files the link points at stay."""
    run_dir = tmp_path / "run"
    a = _run(run_dir, "reco.00001", "101", FILES)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "0.log").write_bytes(b"not the run's\n")
    (elsewhere / "0.rc").write_bytes(b"not the run's\n")
    synced = folding.Folder._sync

    def swapped(self, written):
        shutil.rmtree(a / "chains")
        (a / "chains").symlink_to(elsewhere, target_is_directory=True)
        return synced(self, written)
    monkeypatch.setattr(folding.Folder, "_sync", swapped)
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(a))) == 1
    folder.close()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["0.log", "0.rc"]
    assert not a.exists()


def test_the_report_reads_each_file_of_a_run_whose_removal_a_crash_cut_short(tmp_path: Path) -> None:
    """A crash in the middle of a folded run's removal leaves some of its files in the directory: the report
    reads those there and the others from the folded copy (none lost), and a run folded twice counts once."""
    plan = tmp_path
    run_dir = plan / "run"
    files = {"reclaimed/a.tsv": b"/tmp/a\t10\n", "reclaimed/b.tsv": b"/tmp/b\t20\n"}
    cut = _run(run_dir, "reco.00001", "1", files)
    keep = tmp_path / "a.tsv"
    shutil.copy(cut / "reclaimed" / "a.tsv", keep)
    twice = _run(run_dir, "reco.00002", "2", {"reclaimed/c.tsv": b"/tmp/c\t30\n"})
    again = tmp_path / "again"
    shutil.copytree(twice, again)
    folder = folding.Folder(str(run_dir))
    assert folder.fold(_dirs(str(cut), str(twice))) == 2
    assert folder.fold(_dirs(str(shutil.copytree(again, twice)))) == 1   # folded again: two copies indexed
    folder.close()
    (cut / "reclaimed").mkdir(parents=True)
    shutil.copy(keep, cut / "reclaimed" / "a.tsv")   # what a removal cut short left of the first run
    assert gather._reclaimed(plan) == {"dirs": 3, "bytes": 60}


def test_removals_are_done_several_at_once_and_every_one_is_tried():
    """A round's removals wait on the filesystem (a metadata server, a discard), so they run AT_ONCE at a time
    (issue 55): here four that each wait for the others, which in turn would never end; and an error of one
    comes out once every other was done."""
    import threading

    from hpcrun.bulk import each_at_once

    met = threading.Barrier(4, timeout=10)
    done: list = []
    each_at_once(lambda item: (met.wait(), done.append(item)), [1, 2, 3, 4])
    assert sorted(done) == [1, 2, 3, 4]

    def remove(item: int) -> None:
        if item == 2:
            raise FileNotFoundError(item)
        done.append(item)

    done.clear()
    with pytest.raises(FileNotFoundError):
        each_at_once(remove, [1, 2, 3, 4, 5])
    assert sorted(done) == [1, 3, 4, 5]


def test_removals_are_all_done_where_no_thread_may_start(monkeypatch):
    """A login node's limit on a user's processes: the pool starts two threads, then none ("can't start new
    thread"); every item is still done (one the pool had queued may be done twice: a removal bears it), and a
    removal's error comes out once every item was tried."""
    import threading

    from hpcrun import bulk

    real = threading.Thread.start
    started: list = []

    def start(self):
        if self.name.startswith("hpcrun-remove") and len(started) >= 2:
            raise RuntimeError("can't start new thread")
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    done: list = []
    lock = threading.Lock()

    def remove(item: int) -> None:
        with lock:
            done.append(item)
        if item == 4:
            raise FileNotFoundError(item)

    with pytest.raises(FileNotFoundError):
        bulk.each_at_once(remove, list(range(8)))
    assert set(done) == set(range(8)) and len(started) == 2
