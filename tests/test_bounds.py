"""Bad input is bounded in time and memory and reported with file and line (exit 2)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrun.errors import InputError
from hpcrun.model.yamlsrc import MAX_DEPTH, load_yaml


def _alias_bomb(levels: int) -> str:
    text = 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]\n'
    for i in range(1, levels):
        text += f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n"
    return text


def _plan(spec: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """hpcrun plan in a child process with 1 GiB of address space and 60 s."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    return subprocess.run([sys.executable, "-m", "hpcrun.cli", "plan", str(spec), "--out", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=60, preexec_fn=limit)


@pytest.mark.parametrize("levels", [7, 9])
def test_alias_bomb_is_refused_quickly(tmp_path, levels):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(_alias_bomb(levels) + "name: x\n")
    assert len(spec.read_bytes()) < 1024
    t0 = time.monotonic()
    proc = _plan(spec, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 30
    assert "expands to more than" in proc.stderr and "bomb.yaml, line" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_deep_nesting_is_refused(tmp_path, depth):
    spec = tmp_path / "deep.yaml"
    spec.write_text("name: " + "[" * depth + "]" * depth + "\n")
    proc = _plan(spec, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "nested" in proc.stderr and "Traceback" not in proc.stderr


def test_recursive_alias_is_refused(tmp_path):
    spec = tmp_path / "rec.yaml"
    spec.write_text("name: &a [*a]\n")
    with pytest.raises(InputError) as exc:
        load_yaml(spec)
    assert "recursive" in str(exc.value)


@pytest.mark.parametrize("key", ["list_file", "checksum_catalog"])
def test_device_files_are_not_read_whole(spec_factory, tmp_path, key):
    overrides = {"inputs": {key: "/dev/zero"}}
    spec = spec_factory(overrides)
    proc = _plan(spec, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"inputs.{key}" in proc.stderr and "not a regular file" in proc.stderr


@pytest.mark.parametrize("content, line", [(b"/data/a.raw\n/data/b\xff.raw\n", 2),
                                           (b"/data/a.raw\n\n/data/\x00b.raw\n", 3)])
def test_binary_list_file_names_file_and_line(spec_factory, tmp_path, content, line):
    lst = tmp_path / "files.txt"
    lst.write_bytes(content)
    proc = _plan(spec_factory({"inputs": {"glob": None, "list_file": str(lst), "size": "1GB"}}), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"files.txt, line {line}" in proc.stderr and "Traceback" not in proc.stderr


def test_binary_spec_names_the_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_bytes(b"name: x\nwalltime: \xc3\x28\n")
    proc = _plan(spec, tmp_path)
    assert proc.returncode == 2 and "s.yaml, line 2" in proc.stderr, proc.stderr
