"""Darshan summaries against the logs in ../shared/data/darshan* and the tool outputs stored beside them.

* ``darshan-logs/pydarshan_parse_results.jsonl``: what PyDarshan 3.5.0 returned for each public log
  (modules, partial flags, record counts, bytes per module, agg_perf_by_slowest, exit code, stderr);
* ``darshan/parser/*.parser-total-perf-file.txt``: ``darshan-parser --total --perf --file`` of our logs;
* ``darshan/pydarshan/job_stats_posix.csv``: ``python -m darshan job_stats --csv``;
* ``darshan/*.ior.{txt,json}``: IOR's own output of the run each log comes from.
"""

from __future__ import annotations

import csv
import json
import re
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from hpcrun.iotune.readers.darshan import (
    BINS,
    DarshanLogError,
    DarshanSummary,
    advise,
    build_summary,
    excluded_prefix,
    summarise,
    summary_from_worker,
)
from hpcrun.iotune.readers.darshan_worker import MARKER
from hpcrun.iotune.readers.ior_output import parse_file

from .shared_data import shared_data, shared_data_root

PREFIX = {"POSIX": "POSIX", "MPI-IO": "MPIIO", "STDIO": "STDIO", "H5D": "H5D"}


def _logs() -> List[str]:
    root = shared_data_root()
    if root is None:
        return ["<no shared data>"]
    found = [p for sub in ("darshan", "darshan-logs") for p in (root / sub).rglob("*.darshan*")
             if p.is_file() and ".darshan" in p.name]
    return sorted(str(p.relative_to(root)) for p in found)


def _jsonl() -> Dict[str, Dict[str, Any]]:
    path = shared_data("darshan-logs") / "pydarshan_parse_results.jsonl"
    return {d["file"]: d for d in map(json.loads, path.read_text().splitlines())}


def _expected_to_fail(ref: Dict[str, Any]) -> bool:
    """PyDarshan refused it, crashed, or its C library reported errors while reading it."""
    return (not ref["ok"] or ref["python_exit_code"] != 0
            or any(line.startswith("Error") for line in ref.get("stderr_tail", [])))


@pytest.mark.parametrize("log", _logs())
def test_every_log_summarises_or_fails_cleanly(log):
    root = shared_data()
    path = root / log
    try:
        summary: Optional[DarshanSummary] = summarise(path)
        error = None
    except DarshanLogError as exc:
        summary, error = None, exc
    if log.startswith("darshan-logs/"):
        ref = _jsonl()[log[len("darshan-logs/"):]]
        if _expected_to_fail(ref):
            assert error is not None, f"{log} should not summarise: {ref}"
        else:
            assert summary is not None, error
            _agrees_with_pydarshan_reference(summary, ref)
    else:
        assert summary is not None, error
        _agrees_with_darshan_parser(summary, root / "darshan" / "parser" /
                                    (path.name[:-len(".darshan")] + ".parser-total-perf-file.txt"))
    if error is not None:
        message = str(error)
        assert message.startswith(f"{path}: ") and "\n" not in message and "Traceback" not in message


def _agrees_with_pydarshan_reference(s: DarshanSummary, ref: Dict[str, Any]) -> None:
    assert s.nprocs == ref["nprocs"]
    assert s.jobid == ref["jobid"]
    assert s.log_version == ref["log_ver"] and s.library_version == ref["lib_ver"]
    assert s.exe.startswith(ref["exe"][:60])
    assert [m.name for m in s.modules] == ref["modules"]
    assert sorted(m.name for m in s.modules if m.partial) == sorted(ref["partial"])
    ours = {m.name: m.records for m in s.modules if m.records is not None}
    for name, count in ref["records"].items():
        assert ours.get(name) == count, name
    for name, io in ref.get("io", {}).items():
        mine = s.module_io(name)
        assert mine is not None, name
        assert (mine.bytes_read, mine.bytes_written) == (io["bytes_read"], io["bytes_written"]), name
        if "agg_perf_by_slowest_MiBps" in io:
            assert mine.perf_by_slowest_mib == pytest.approx(io["agg_perf_by_slowest_MiBps"], abs=0.006), name
    assert any("partial" in w for w in s.warnings) == bool(ref["partial"])


def _parser_totals(path: Path) -> Dict[str, Any]:
    text = path.read_text()
    totals = {k: float(v) for k, v in re.findall(r"^total_(\w+): (\S+)$", text, re.MULTILINE)}
    perf: Dict[str, float] = {}
    module = None
    for line in text.splitlines():
        m = re.match(r"^# (\S+) module data$", line)
        if m:
            module = m.group(1)
        m = re.match(r"^# agg_perf_by_slowest: (\S+)", line)
        if m and module:
            perf[module] = float(m.group(1))
    return {"nprocs": int(re.search(r"^# nprocs: (\d+)$", text, re.MULTILINE).group(1)),  # type: ignore[union-attr]
            "modules": re.findall(r"^# (\S+) module: \d+ bytes", text, re.MULTILINE),
            "totals": totals, "perf": perf}


def _record_sums(parser_txt: Path) -> Dict[str, float]:
    """Per-counter sums over the records of plain ``darshan-parser`` output (-1, 'not monitored', left out);
    --total covers only POSIX, MPI-IO and STDIO."""
    sums: Dict[str, float] = {}
    for line in parser_txt.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 5 and not line.startswith("#") and float(fields[4]) >= 0:
            sums[fields[3]] = sums.get(fields[3], 0.0) + float(fields[4])
    return sums


def _agrees_with_darshan_parser(s: DarshanSummary, parser_file: Path) -> None:
    ref = _parser_totals(parser_file)
    assert s.nprocs == ref["nprocs"]
    assert [m.name for m in s.modules] == ref["modules"]
    t = dict(_record_sums(parser_file.with_name(parser_file.name.replace("-total-perf-file", ""))))
    t.update(ref["totals"])
    checked = 0
    for m in s.io:
        p = PREFIX[m.module]
        assert (m.bytes_read, m.bytes_written) == (t[f"{p}_BYTES_READ"], t[f"{p}_BYTES_WRITTEN"]), m.module
        for kind, value in (("READ", m.read_time_s), ("WRITE", m.write_time_s), ("META", m.meta_time_s)):
            assert value == pytest.approx(t[f"{p}_F_{kind}_TIME"], abs=1e-5), (m.module, kind)
        agg = "AGG_" if m.module in ("MPI-IO", "H5D") else ""
        for direction, hist in (("READ", m.read_hist), ("WRITE", m.write_hist)):
            if m.module == "STDIO":
                assert hist is None
                continue
            assert hist == tuple(int(t[f"{p}_SIZE_{direction}_{agg}{b}"]) for b in BINS), (m.module, direction)
        if m.module in ref["perf"]:
            assert m.perf_by_slowest_mib == pytest.approx(ref["perf"][m.module], abs=1e-5)
        checked += 1
    assert checked == sum(1 for name in ref["modules"] if name in PREFIX)


def test_job_stats_agree():
    root = shared_data("darshan")
    with open(root / "pydarshan" / "job_stats_posix.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for row in rows:
        s = summarise(root / row["log_file"])
        posix = s.module_io("POSIX")
        assert posix is not None
        assert (s.jobid, s.nprocs) == (int(row["job_id"]), int(row["nprocs"]))
        assert s.runtime_s == pytest.approx(float(row["run_time"]))
        assert posix.bytes_read + posix.bytes_written == int(row["total_bytes"])
        assert posix.records == int(row["total_files"])


def _ior_twin(log: Path) -> Optional[Path]:
    stem = log.name[:-len(".darshan")]
    return next((p for p in sorted(log.parent.glob(stem + ".ior.*"))), None)


def test_darshan_agrees_with_ior_of_the_same_run():
    root = shared_data("darshan")
    pairs = [(log, _ior_twin(log)) for log in sorted(root.glob("*.darshan")) if _ior_twin(log)]
    assert len(pairs) >= 6
    for log, twin in pairs:
        run = parse_file(twin)  # type: ignore[arg-type]
        s = summarise(log)
        layer = {"POSIX": "POSIX", "MPIIO": "MPI-IO", "HDF5": "H5D"}[run.ops[0].api]
        m = s.module_io(layer)
        if m is None:  # the run on /dev/shm with Darshan's default exclusions: nothing recorded, and said so
            assert any("excludes by default" in w and "/dev/shm" in w for w in s.warnings)
            assert any("no data for any file" in w for w in s.warnings)
            continue
        for op in run.ops:
            moved = m.bytes_written if op.operation == "write" else m.bytes_read
            assert moved == op.aggregate_bytes == op.aggregate_mib * 2**20
            if layer == "POSIX":  # same calls, same phase: Darshan's span bandwidth is IOR's within a few %
                bw = m.write_bw_mib if op.operation == "write" else m.read_bw_mib
                assert bw == pytest.approx(op.bw_mib_mean, rel=0.05), (log.name, op.operation)
        access = s.dominant_access()
        assert access is not None and access[1] == run.ops[0].transfer_size


def test_tmpfs_records_and_their_mount_are_explained():
    s = summarise(shared_data("darshan") / "ior_tmpfs_posix_fpp_n2_t4m_b64m_fsync_excludenone.darshan")
    assert ("/dev", "devtmpfs") in s.mounts
    assert any("devtmpfs" in w for w in s.warnings)
    assert not any("excludes by default" in w for w in s.warnings)


def test_histogram_bins_follow_darshans_inclusive_bounds():
    """IOR 1m lands in 100K_1M and 4k in 1K_10K (Darshan's upper bounds are inclusive)."""
    root = shared_data("darshan")
    one_meg = summarise(root / "0_ior_id4242-7077_11-22-16168-16741210737227211349_1.darshan").module_io("POSIX")
    four_k = summarise(root / "ior_posix_ssf_n4_t4k_b16m.darshan").module_io("POSIX")
    assert one_meg is not None and four_k is not None
    assert one_meg.write_hist is not None and four_k.write_hist is not None
    assert one_meg.write_hist[BINS.index("100K_1M")] == one_meg.writes
    assert four_k.write_hist[BINS.index("1K_10K")] == four_k.writes


# ---- advice --------------------------------------------------------------------------------------

def test_advise_compares_the_common_access_size():
    s = summarise(shared_data("darshan") / "ior_posix_ssf_n4_t4k_b16m.darshan")
    dominant = s.dominant_access()
    assert dominant is not None
    size = dominant[1]
    assert advise(s, size) is None
    assert advise(s, size * 4) is None  # within the factor
    far = advise(s, size * 256)
    assert far is not None and "256x smaller" in far and str(s.source) in far
    big = advise(s, size // 8)
    assert big is not None and "8x larger" in big
    assert advise(s, size * 16, factor=32) is None


def test_advise_without_access_data_says_nothing():
    s = build_summary("fake.darshan", {"job": {"nprocs": 1, "exe": "app"}, "modules": {}, "io": {}})
    assert advise(s, 2**20) is None
    with pytest.raises(ValueError):
        advise(s, 0)


# ---- failures made on purpose (no shared data needed) --------------------------------------------

def test_excluded_prefixes():
    assert excluded_prefix("/dev/shm/x") == "/dev/"
    assert excluded_prefix("/opt/app/data") == "/opt/"
    assert excluded_prefix("/var/opt/cray/dws/mounts/batch/x") is None  # DataWarp is re-included
    assert excluded_prefix("/var/tmp/x") == "/var/"
    assert excluded_prefix("/scratch/x") is None and excluded_prefix("/development/x") is None


def test_excluded_target_is_warned_about():
    payload = {"job": {"nprocs": 2, "exe": "/usr/bin/ior -a POSIX -o /opt/data/f"},
               "modules": {"STDIO": {"len": 50, "partial": False, "records": 1}},
               "io": {"STDIO": {"records": 1, "paths": ["<STDOUT>"]}}}
    s = build_summary("x.darshan", payload)
    assert any("/opt/data/f, under /opt/" in w and "DARSHAN_EXCLUDE_DIRS=none" in w for w in s.warnings)
    assert any("no data for any file" in w for w in s.warnings)


@pytest.mark.parametrize("rc, stdout, stderr, needle", [
    (-11, "", "", "crashed (signal SIGSEGV)"),
    (134, MARKER + '{"job": {"nprocs": 0}}', "Error: failed to read name hash", "crashed (signal SIGABRT)"),
    (2, MARKER + '{"error": "RuntimeError: Failed to open file."}', "Error: bad header", "cannot open it"),
    (3, MARKER + '{"error": "the \'darshan\' Python package is not installed"}', "", "not installed"),
    (1, "", "Traceback ...\nSomeError: boom", "exit code 1"),
    (0, "garbage", "", "without a result"),
    (0, MARKER + '{"job": {"nprocs": 4, "exe": "a"}, "modules": {"POSIX": {"len": 9, "records": 0}}, "io": {}}',
     "", "none of their records could be read"),
    (0, MARKER + '{"job": {"nprocs": 4, "exe": "a"}, "modules": {}, "io": {}}',
     "Error: unable to read compressed data from file.", "read only part of it"),
    (0, MARKER + '{"job": {"nprocs": 0}, "modules": {}, "io": {}}', "", "0 processes"),
])
def test_worker_outcomes_become_clear_errors(rc, stdout, stderr, needle):
    with pytest.raises(DarshanLogError) as err:
        summary_from_worker("run.darshan", rc, stdout, stderr)
    assert needle in str(err.value) and str(err.value).startswith("run.darshan: ")


def test_missing_and_unreadable_logs(tmp_path: Path):
    with pytest.raises(DarshanLogError, match="no such file"):
        summarise(tmp_path / "nope.darshan")
    with pytest.raises(DarshanLogError, match="not a regular file"):
        summarise(tmp_path)


def test_empty_and_gzip_logs(tmp_path: Path):
    pytest.importorskip("darshan")
    empty = tmp_path / "empty.darshan"
    empty.write_bytes(b"")
    with pytest.raises(DarshanLogError, match="empty"):
        summarise(empty)
    gz = tmp_path / "old.darshan.gz"
    gz.write_bytes(b"\x1f\x8b" + b"\0" * 100)
    with pytest.raises(DarshanLogError, match="Darshan 2.x log"):
        summarise(gz)


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_hanging_reader_times_out(tmp_path: Path):
    log = tmp_path / "slow.darshan"
    log.write_bytes(b"x")
    with pytest.raises(DarshanLogError, match="longer than 0.5 s"):
        summarise(log, timeout=0.5, python=_fake_python(tmp_path, "exec sleep 30"))


def test_a_reader_killed_by_a_signal(tmp_path: Path):
    log = tmp_path / "killed.darshan"
    log.write_bytes(b"x")
    with pytest.raises(DarshanLogError, match=r"crashed \(signal SIGKILL\)"):
        summarise(log, python=_fake_python(tmp_path, "kill -9 $$"))
