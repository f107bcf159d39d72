"""``hpcrun iotune darshan``: table or JSON, per-log errors, exit codes, advice."""

from __future__ import annotations

import json
from pathlib import Path

from .shared_data import shared_data


def test_iotune_without_subcommand_shows_help(cli):
    result = cli("iotune")
    assert result.exit_code == 0 and "darshan" in result.output


def test_all_logs_summarised_exit_0(cli):
    root = shared_data("darshan")
    logs = [str(root / "ior_posix_ssf_n4_t4k_b16m.darshan"), str(root / "nonmpi_dd_8x1m.darshan")]
    result = cli("iotune", "darshan", *logs, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "ior_posix_ssf_n4_t4k_b16m.darshan" in result.output and "64.0 MiB" in result.output
    assert "warning:" in result.output and "/dev/zero" in result.output  # dd read /dev/zero: excluded path
    assert "advice:" not in result.output  # no --best-transfer-size


def test_damaged_logs_give_per_log_errors_and_exit_1(cli):
    good = shared_data("darshan") / "ior_posix_ssf_n2_t64k_b16m.darshan"
    bad = sorted((shared_data("darshan-logs") / "synthetic_malformed").glob("*.darshan"))
    assert len(bad) == 3
    result = cli("iotune", "darshan", str(good), *map(str, bad), "--json")
    assert result.exit_code == 1
    entries = json.loads(result.stdout)
    assert [e["ok"] for e in entries] == [True, False, False, False]
    assert entries[0]["bytes_written"] == entries[0]["io"]["POSIX"]["bytes_written"] > 0
    for log in bad:
        assert f"error: {log}: " in result.stderr


def test_best_transfer_size_gives_advice(cli):
    log = shared_data("darshan") / "ior_posix_ssf_n4_t4k_b16m.darshan"
    result = cli("iotune", "darshan", str(log), "--best-transfer-size", "1MiB", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "advice:" in result.output and "256x smaller" in result.output
    as_json = json.loads(cli("iotune", "darshan", str(log), "--json", "--best-transfer-size", "4k").stdout)
    assert as_json[0]["advice"] is None


def test_missing_log_and_bad_size(cli, tmp_path: Path):
    result = cli("iotune", "darshan", str(tmp_path / "missing.darshan"))
    assert result.exit_code == 1 and "no such file" in result.stderr
    result = cli("iotune", "darshan", str(tmp_path / "x.darshan"), "--best-transfer-size", "lots")
    assert result.exit_code == 2 and "--best-transfer-size" in result.output
