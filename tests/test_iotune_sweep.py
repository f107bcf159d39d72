"""The sweep model and its presets: validation errors name file, line and key (or the option)."""

from __future__ import annotations

import pytest

from hpcrun.errors import InputError
from hpcrun.iotune.sweeps.presets import available, load_sweep
from hpcrun.iotune.sweeps.sweep import default_block

from .conftest import REPO


def _problems(preset, overrides=None):
    with pytest.raises(InputError) as info:
        load_sweep(preset, overrides or {})
    return info.value.problems


def test_shipped_presets_validate():
    names = available()
    assert {"bb-vs-scratch", "quick"} <= set(names)
    for name in names:
        sweep, _ = load_sweep(name, {})
        assert sweep.name == name
    bb, _ = load_sweep("bb-vs-scratch", {})
    assert bb.targets == ["bb", "scratch"] and bb.writers == [1, 4, 16]
    assert bb.transfer_sizes == [64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20]
    assert (REPO / "iobench" / "bb-vs-scratch.yaml").is_file()


def test_unknown_key_has_file_line_and_suggestion(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("name: mine\ntransfer_sizes: [1m]\nwriter: [1, 2]\n")
    [p] = _problems(str(preset))
    assert p.file == str(preset) and p.line == 3 and p.key == "writer"
    assert "Did you mean 'writers'?" in p.message and "Valid keys here" in p.message


def test_several_problems_reported_together(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("transfer_sizes: [64k, 3]\nreps: 0\ntargets: [relative/dir]\napis: [posix, nfs]\n")
    problems = _problems(str(preset))
    by_key = {p.key.split("[")[0]: p for p in problems}
    assert set(by_key) >= {"transfer_sizes", "reps", "targets", "apis"}
    assert "multiple of 8" in by_key["transfer_sizes"].message and by_key["transfer_sizes"].line == 1
    assert by_key["reps"].line == 2
    assert "absolute path" in by_key["targets"].message and by_key["targets"].line == 3
    assert "'posix', 'mpiio' or 'hdf5'" in by_key["apis"].message


def test_block_must_be_multiple_of_every_transfer(tmp_path):
    [p] = _problems(None, {"transfer_sizes": ["64k", "3m"], "block_sizes": ["4m"]})
    assert "multiple of transfer size" in p.message


def test_command_line_errors_name_the_option():
    [p] = _problems(None, {"transfer_sizes": ["lots"]})
    assert p.file == "<command line>" and p.key == "--transfer-size" and "not a size" in p.message
    [p] = _problems("quick", {"targets": ["bb", "bb"]})
    assert p.key == "--target" and "twice" in p.message


def test_missing_transfer_sizes_without_preset():
    [p] = _problems(None, {})
    assert p.key == "--transfer-size" and "missing" in p.message


def test_fio_refuses_mpiio_and_nodes():
    [p] = _problems(None, {"transfer_sizes": ["1m"], "apis": ["mpiio"], "engine": "fio"})
    assert "fio measures POSIX" in p.message
    [p] = _problems(None, {"transfer_sizes": ["1m"], "nodes": [2], "engine": "fio"})
    assert "fio runs on one node" in p.message


def test_unknown_preset_suggests():
    [p] = _problems("quik")
    assert "Did you mean 'quick'?" in p.message


def test_overrides_replace_preset_values():
    sweep, _ = load_sweep("quick", {"writers": [4], "targets": ["/data"], "operations": ["write"]})
    assert sweep.writers == [4] and sweep.targets == ["/data"] and sweep.operations == ["write"]
    assert sweep.transfer_sizes == [64 * 2**10, 2**20, 4 * 2**20]      # from the preset


def test_default_block_is_a_common_multiple():
    assert default_block([65536, 2**20]) == 16 * 2**20
    assert default_block([3 * 2**20, 2**20]) == 18 * 2**20      # >= 16 MiB, multiple of 3 MiB
    assert default_block([64 * 2**20]) == 256 * 2**20


def test_auto_prefers_an_installed_ior_and_a_named_engine_never_looks(tmp_path, monkeypatch):
    """What --engine auto does depends on the machine, so the tests that mean fio say fio."""
    from hpcrun.iotune.sweeps.plan import choose_engine
    from hpcrun.iotune.sweeps.sweep import Sweep
    from hpcrun.model.profiles import load_profile
    profile = load_profile("local-test").profile
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "ior").write_text("#!/bin/sh\nexit 1\n")
    (stand_in / "ior").chmod(0o755)
    (stand_in / "fio").symlink_to("/bin/true")
    monkeypatch.setenv("PATH", str(stand_in))
    assert choose_engine(Sweep(transfer_sizes=[2 ** 20]), profile) == ("ior", "ior")
    assert choose_engine(Sweep(transfer_sizes=[2 ** 20], engine="fio"), profile) == ("fio", "fio")
    (stand_in / "ior").unlink()
    assert choose_engine(Sweep(transfer_sizes=[2 ** 20]), profile) == ("fio", "fio")
