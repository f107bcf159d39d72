"""IOR reader and command-line checker against the real IOR 4.0.0 outputs in ../shared/data/ior.

The JSON and the text file of one configuration come from two separate executions (see
shared/data/ior/README.md), so they agree exactly on everything IOR was asked to do (API, sizes,
segments, ranks, repetitions, layout, tests) but not on measured bandwidth. Measured figures are
checked against the other figures of the same file: the summary statistics against the
per-repetition rows, and OPs against bandwidth / transfer size.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Dict, List

import pytest

from hpcrun.iotune.engines.ior_argv import (
    IorCommandError,
    IorPoint,
    build_ior_argv,
    check_ior_argv,
    check_ior_command,
    ior_size,
    parse_ior_size,
)
from hpcrun.iotune.readers.ior_output import IorParseError, IorRun, parse_file, parse_json, parse_text

from .shared_data import shared_data, shared_data_root

MIB = 2**20


def _manifest() -> List[Dict[str, str]]:
    root = shared_data_root()
    if root is None or not (root / "ior" / "manifest.csv").is_file():
        return []
    with open(root / "ior" / "manifest.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _twins() -> List[str]:
    """Names (relative to ior/, without suffix) that have both a .json and a .txt."""
    root = shared_data_root()
    if root is None:
        return ["<no shared data>"]
    return sorted(str(p.relative_to(root / "ior"))[:-5] for p in (root / "ior").glob("*/*.json")
                  if p.with_suffix(".txt").is_file())


def _row(name: str) -> Dict[str, str]:
    base = name.rsplit("/", 1)[-1]
    return next((r for r in _manifest() if r["name"] == base), {})


def _failed(row: Dict[str, str]) -> bool:
    return row.get("rc_json") not in ("0", None, "") and row.get("json_valid") == "INVALID"


@pytest.mark.parametrize("name", _twins())
def test_json_and_text_twins_agree(name):
    ior = shared_data("ior")
    json_path, text_path = ior / f"{name}.json", ior / f"{name}.txt"
    row = _row(name)
    if _failed(row):
        for path in (json_path, text_path):
            with pytest.raises(IorParseError) as err:
                parse_file(path)
            assert str(path) in str(err.value) and "\n" not in str(err.value)
        return
    run_j, run_t = parse_file(json_path), parse_file(text_path)
    assert (run_j.format, run_t.format) == ("json", "text")
    assert run_j.version == run_t.version == "4.0.0"
    assert len(run_j.ops) == len(run_t.ops) > 0
    for op_j, op_t in zip(run_j.ops, run_t.ops):
        for field in ("operation", "api", "transfer_size", "block_size", "segments", "tasks", "tasks_per_node",
                      "reps", "file_per_proc", "test_id", "reorder_tasks", "test_file"):
            assert getattr(op_j, field) == getattr(op_t, field), (field, op_j, op_t)
        assert op_j.aggregate_mib == pytest.approx(op_t.aggregate_mib, abs=0.051)
        assert op_j.aggregate_mib * MIB == op_j.aggregate_bytes
        assert (op_j.stonewall_time_s is None) == (op_t.stonewall_time_s is None)
    for run in (run_j, run_t):
        _self_consistent(run)
        _matches_command(run)
        _matches_manifest(run, row)


def _self_consistent(run: IorRun) -> None:
    """Summary statistics agree with the repetition rows of the same file; OPs = bw / transfer size."""
    tol = 1e-3 if run.format == "json" else 0.51  # text rows >= 3600 print without decimals
    for op in run.ops:
        assert len(op.results) == op.reps, op
        bws = [r.bw_mib for r in op.results]
        assert [r.iteration for r in op.results] == list(range(op.reps))
        assert max(bws) == pytest.approx(op.bw_mib_max, abs=tol)
        assert min(bws) == pytest.approx(op.bw_mib_min, abs=tol)
        assert statistics.fmean(bws) == pytest.approx(op.bw_mib_mean, abs=tol)
        assert statistics.pstdev(bws) == pytest.approx(op.bw_mib_std, abs=tol * 2)
        assert op.bw_mib_min <= op.bw_mib_mean <= op.bw_mib_max
        for r in op.results:
            assert r.operation == op.operation
            assert r.xfer_kib * 1024 == op.transfer_size and r.block_kib * 1024 == op.block_size
        per_op = MIB / op.transfer_size
        for ops, bw in ((op.ops_max, op.bw_mib_max), (op.ops_min, op.bw_mib_min), (op.ops_mean, op.bw_mib_mean)):
            assert ops == pytest.approx(bw * per_op, rel=1e-4, abs=0.011 * per_op + 0.011)


def _matches_command(run: IorRun) -> None:
    """The 'Command line' IOR echoes names the same sizes and API as the parsed rows."""
    assert run.command
    args = check_ior_argv([w for w in run.command.split() if w != "-v"])  # -v + JSON is refused on purpose
    if args.script:
        return  # a -f script sets the sizes itself
    for op in run.ops:
        assert (op.api.upper(), op.transfer_size, op.block_size, op.segments, op.file_per_proc, op.reps) == (
            args.api.upper(), args.transfer_size, args.block_size, args.segments, args.file_per_proc, args.reps)
    assert {op.operation for op in run.ops} == {o for o, on in (("write", args.write), ("read", args.read)) if on}


def _matches_manifest(run: IorRun, row: Dict[str, str]) -> None:
    if not row.get("api"):
        return  # the multi-test script row has no single configuration
    for op in run.ops:
        assert op.api == row["api"]
        assert op.tasks == int(row["np"])
        assert op.transfer_size == parse_ior_size(row["xfer"])
        assert op.block_size == parse_ior_size(row["block"])
        assert op.file_per_proc == (row["mode"] == "fpp")


def test_every_manifest_configuration_has_been_checked():
    shared_data("ior")
    rows = _manifest()
    assert len(rows) == 127
    with_twins = set(_twins())
    for row in rows:
        if row["json"] and row["text"]:
            assert row["json"][:-5] in with_twins, row["name"]


def test_json_only_outputs_parse():
    ior = shared_data("ior")
    stdout_json = parse_file(ior / "extras" / "ior_mpiio_ssf_n2_t1m_b16m_json_stdout.txt")
    assert stdout_json.format == "json" and [o.operation for o in stdout_json.ops] == ["write", "read"]
    _self_consistent(stdout_json)
    for path in sorted((ior / "extras").glob("*.txt")):
        if path.with_suffix(".json").exists() or "csv" in path.name or "json_stdout" in path.name:
            continue
        run = parse_file(path)  # the text-only runs (keep, perrank)
        _self_consistent(run)
        _matches_command(run)


def test_multitest_script_gives_one_row_per_test_and_operation():
    ior = shared_data("ior")
    script = (ior / "extras" / "multitest.ior").read_text()
    transfers = [parse_ior_size(line.split("=", 1)[1]) for line in script.splitlines()
                 if line.strip().startswith("transferSize=")]
    for suffix in ("json", "txt"):
        run = parse_file(ior / "extras" / f"ior_multitest_script_n2.{suffix}")
        assert sorted({o.test_id for o in run.ops}) == list(range(3))
        # settings persist from one RUN to the next: each RUN uses the last transferSize before it
        assert [run.op("write", t).transfer_size for t in range(3)] == transfers  # type: ignore[union-attr]


def test_verbose_json_is_repaired_with_a_warning():
    ior = shared_data("ior")
    run = parse_file(ior / "extras" / "ior_posix_fpp_n2_t1m_b16m_verbose.json")
    assert any("-v" in w for w in run.warnings)
    _self_consistent(run)


def test_stonewall_fields():
    ior = shared_data("ior")
    for suffix in ("json", "txt"):
        run = parse_file(ior / "extras" / f"ior_posix_fpp_n2_t1m_b16m_stonewall.{suffix}")
        for op in run.ops:
            assert op.stonewall_time_s is not None and op.stonewall_bw_mib_mean is not None
            assert op.stonewall_bw_mib_mean > 0


@pytest.mark.parametrize("name, content", [
    ("ior_posix_ssf_n2_t3k_b16m_ERROR_block_not_multiple_of_xfer.json",
     ["is empty", "block size must be a multiple of transfer size"]),
    ("ior_posix_ssf_n2_t1m_b16m_ERROR_nonexistent_dir.json", ["truncated", "No such file or directory"]),
    ("ior_posix_ssf_n2_t1m_b16m_ERROR_dryrun.json", ["truncated", "Cannot create file"]),
    ("ior_posix_ssf_n2_t3k_b16m_ERROR_block_not_multiple_of_xfer.txt",
     ["did not finish", "block size must be a multiple of transfer size"]),
    ("ior_posix_ssf_n2_t1m_b16m_ERROR_nonexistent_dir.txt", ["did not finish", "open64"]),
    ("ior_posix_ssf_n2_t1m_b16m_ERROR_dryrun.txt", ["did not finish", "Cannot create file"]),
    ("ior_posix_ssf_n2_t1m_b16m_reps2_csv_stdout.txt", ["CSV", "summaryFormat=JSON"]),
])
def test_failed_runs_give_a_clear_error(name, content):
    path = shared_data("ior") / "extras" / name
    with pytest.raises(IorParseError) as err:
        parse_file(path)
    message = str(err.value)
    assert message.startswith(str(path) + ": ")
    for needle in content:
        assert needle in message
    assert "Traceback" not in message and "\n" not in message


def test_every_truncation_is_a_clean_error():
    """Cut real outputs anywhere: a clean IorParseError (or a still-complete result), never a crash."""
    ior = shared_data("ior")
    for path in (ior / "extras" / "ior_posix_ssf_n2_t1m_b16m_reps3.json",
                 ior / "extras" / "ior_multitest_script_n2.txt"):
        text = path.read_text()
        parse = parse_json if path.suffix == ".json" else parse_text
        full = parse(text, path.name)
        for cut in range(0, len(text), 53):
            try:
                run = parse(text[:cut], path.name)
            except IorParseError as exc:
                assert str(exc).startswith(path.name + ": ")
                continue
            # text output cut after the summary rows still holds every row
            assert run.ops == full.ops[:len(run.ops)] and path.suffix == ".txt"


def test_nan_and_inf_values_are_numbers():
    text = (shared_data("ior") / "grid" / "ior_posix_ssf_n1_t1m_b16m.json").read_text()
    assert '"bwStdMIB": 0.0000' in text and '"OPsSD": 0.0000' in text
    damaged = text.replace('"bwStdMIB": 0.0000', '"bwStdMIB": -nan').replace('"OPsSD": 0.0000', '"OPsSD": "inf"')
    run = parse_json(damaged, "x.json")
    assert math.isnan(run.ops[0].bw_mib_std) and math.isinf(run.ops[0].ops_std)


def test_messages_mixed_into_json_are_skipped():
    text = (shared_data("ior") / "grid" / "ior_posix_ssf_n1_t1m_b16m.json").read_text()
    lines = text.splitlines()
    lines.insert(len(lines) // 2, "WARNING: something IOR printed to stdout")
    run = parse_json("Writing output to stdout\n" + "\n".join(lines), "mixed.json")
    assert run.ops == parse_json(text, "clean.json").ops
    assert any("skipped 1 line" in w for w in run.warnings)


def test_inputs_that_are_not_ior_output():
    for parse, text, needle in ((parse_json, "", "empty"), (parse_json, "hello", "no JSON object"),
                                (parse_json, '{"Version": "4.0.0", "tests": []}', "no 'summary'"),
                                (parse_json, '{"summary": [{"operation": "write"}]}', 'no "TestID"'),
                                (parse_text, "  \n", "empty"), (parse_text, "{}", "JSON"),
                                (parse_text, "some other program\n", "not IOR 4.0 text output")):
        with pytest.raises(IorParseError) as err:
            parse(text, "in.txt")
        assert needle in str(err.value) and str(err.value).startswith("in.txt: ")


def test_unreadable_file(tmp_path: Path):
    with pytest.raises(IorParseError, match="cannot be read"):
        parse_file(tmp_path / "missing.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(IorParseError, match="empty"):
        parse_file(tmp_path / "empty.json")


# ---- command lines -----------------------------------------------------------------------------

def _manifest_commands() -> List[tuple]:
    rows = _manifest()
    if not rows:
        return [("<no shared data>", "cmd_json", "")]
    return [(r["name"], col, r[col]) for r in rows for col in ("cmd_json", "cmd_text") if r[col] not in ("", "-")]


@pytest.mark.parametrize("name, column, command", _manifest_commands())
def test_manifest_command_lines_pass_the_checker(name, column, command):
    shared_data("ior")
    row = _row(name)
    # the only command lines IOR 4.0 could not run as intended: a block size that is not a multiple of the
    # transfer size (IOR aborted), and -v with a JSON summary (IOR wrote invalid JSON)
    if "block_not_multiple" in row["variant"]:
        with pytest.raises(IorCommandError, match="multiple of the transfer size"):
            check_ior_command(command)
        return
    if " -v " in command and "summaryFormat=JSON" in command:
        with pytest.raises(IorCommandError, match="-v with summaryFormat=JSON"):
            check_ior_command(command)
        return
    args = check_ior_command(command)
    assert args.tasks == int(row["np"]) if row["np"] else args.tasks is not None
    if row["api"] and not args.script:
        assert args.api == row["api"]
        assert args.transfer_size == parse_ior_size(row["xfer"])
        assert args.block_size == parse_ior_size(row["block"])
        assert args.file_per_proc == (row["mode"] == "fpp")
    if column == "cmd_json" and "summaryFormat=JSON" in command:
        assert args.summary_format == "JSON"


@pytest.mark.parametrize("api", ["POSIX", "MPIIO", "HDF5"])
@pytest.mark.parametrize("transfer", [8, 4096, 65536, 2**20, 4 * 2**20, 16 * 2**20])
@pytest.mark.parametrize("fpp", [True, False])
def test_generated_command_lines_pass_the_checker(api, transfer, fpp):
    point = IorPoint(test_file="/scratch/iotune/f", transfer_size=transfer, block_size=64 * 2**20, api=api,
                     file_per_proc=fpp, reps=3, summary_file="/scratch/iotune/p.json", fsync=True)
    argv = build_ior_argv(point, ior="/usr/local/bin/ior")
    assert "-v" not in argv
    args = check_ior_argv(argv)
    assert (args.api, args.transfer_size, args.block_size, args.reps, args.file_per_proc) == (
        api, transfer, 64 * 2**20, 3, fpp)
    assert (args.summary_format, args.summary_file, args.write, args.read) == (
        "JSON", "/scratch/iotune/p.json", True, True)


def test_ior_sizes_round_trip():
    for n in (8, 1000, 4096, 3 * 1024, 65536, 2**20, 5 * 2**30):
        assert parse_ior_size(ior_size(n)) == n
    assert ior_size(2**20) == "1m" and ior_size(4096) == "4k" and ior_size(1000) == "1000"
    for bad in ("1.5m", "1MB", "m", "-4k", "4 k k"):
        assert parse_ior_size(bad) is None


@pytest.mark.parametrize("command, needle", [
    ("ior -wr -t 1m -b 16m", "does not bundle flags"),
    ("ior -t 3k -b 16m", "multiple of the transfer size"),
    ("ior -t 1m -b 512k", "multiple of the transfer size"),
    ("ior -t 12 -b 24", "multiple of 8"),
    ("ior -t 1.5m -b 16m", "not a size IOR reads correctly"),
    ("ior -t 1MB -b 16m", "not a size IOR reads correctly"),
    ("ior -a POSIX -t 1m -b 1m -z", "-z (random offsets) needs a block size larger"),
    ("ior -C -Z", "exclude each other"),
    ("ior -v -O summaryFormat=JSON -O summaryFile=/tmp/x.json", "-v with summaryFormat=JSON"),
    ("ior -O summaryFormat=XML", "summaryFormat is default, JSON or CSV"),
    ("ior -O nosuchkey=1", "unknown directive 'nosuchkey'"),
    ("ior -a NOPE", "unknown API"),
    ("ior -t", "'-t' needs a value"),
    ("ior --posix.odirec", "did you mean '--posix.odirect'"),
    ("ior -q7 -y", "unknown option '-y'"),
    ("ior -t 1m -b 16m /tmp/file", "takes no positional arguments"),
    ("mpirun -np 4 ./ior -i x", "'-i x': expected a whole number"),
    ("srun -n 4 hostname", "no 'ior' executable"),
])
def test_bad_command_lines_fail_with_a_clear_message(command, needle):
    with pytest.raises(IorCommandError) as err:
        check_ior_command(command)
    assert needle in str(err.value)
    assert str(err.value).startswith(f"IOR command line '{command}' is not valid for IOR 4.0: (1) ")


def test_value_forms_ior_accepts():
    args = check_ior_argv(["ior", "-t1m", "-b=16m", "-s", "4", "--posix.lustre.stripecount=4", "-O",
                           "stoneWallingWearOut=1,summaryFormat=csv", "-D", "2", "-W"])
    assert (args.transfer_size, args.block_size, args.segments) == (2**20, 16 * 2**20, 4)
    assert args.summary_format == "csv" and not args.write and not args.read  # -W alone: check-write only
    defaults = check_ior_argv(["ior"])
    assert (defaults.api, defaults.transfer_size, defaults.block_size, defaults.write, defaults.read) == (
        "POSIX", 262144, 2**20, True, True)


def test_impossible_points_are_refused():
    with pytest.raises(IorCommandError, match="neither writes nor reads"):
        build_ior_argv(IorPoint("/x", 2**20, 2**24, write=False, read=False))
    with pytest.raises(IorCommandError, match="multiple of the transfer size"):
        build_ior_argv(IorPoint("/x", 3 * 2**20, 2**24))
