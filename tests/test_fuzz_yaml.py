"""Generated spec and profile YAML through `hpcrun plan`: exit 0 with scripts that pass
`bash -n` and shellcheck, or exit 2 with a located message; never 70, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import base_spec, shellcheck_cmd

pytestmark = pytest.mark.slow

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
SCALAR = st.one_of(TEXT, st.integers(-5, 10**12), st.booleans(), st.none(), st.floats(allow_nan=True),
                   st.sampled_from(["auto", "1GB", "00:10:00", "{stem}", "{input}", "/tmp", "-", "..", "\t"]))
VALUE = st.recursive(SCALAR, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                     st.dictionaries(TEXT, kids, max_size=3)), max_leaves=8)
SPEC_KEYS = ["name", "walltime", "description", ("site", "account"), ("site", "extra_sbatch"), ("inputs", "glob"),
             ("inputs", "list_file"), ("jobs", "chains_per_node"), ("jobs", "files_per_job"), ("chain", "command"),
             ("merge", "command"), ("outputs", "location"), ("outputs", "pattern"), ("software", "env"),
             ("software", "release"), ("database",), ("burst_buffer",), ("container",), ("qa",), ("finalize",)]


def _plan(spec: Path, out: Path, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrun.cli", "plan", str(spec), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)


def _check(proc: subprocess.CompletedProcess, out: Path) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert ", key '" in proc.stderr or "line" in proc.stderr or ": " in proc.stderr
        return
    scripts = [str(p) for p in sorted(out.glob("jobs/*.sbatch"))[:3] + sorted(out.glob("bin/*.sh"))]
    for s in scripts:
        assert subprocess.run(["bash", "-n", s], capture_output=True).returncode == 0, s
    # SC2215/SC2275/SC2287/SC2288: "is this really a command name?" of a program the spec names as odd as
    # '<' or '-x': it is quoted and run as written (the job then fails to find it), not shell syntax
    lint = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "warning", "-e", "SC2215,SC2275,SC2287,SC2288",
                                              *scripts], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(SPEC_KEYS), value=VALUE)
def test_fuzzed_spec_values(tmp_path_factory, key, value):
    tmp = tmp_path_factory.mktemp("fz")
    data_dir = tmp / "data"
    data_dir.mkdir()
    (data_dir / "a.raw").write_bytes(b"x")
    spec = base_spec(data_dir, tmp)
    path = key if isinstance(key, tuple) else (key,)
    target = spec
    for p in path[:-1]:
        target = target.setdefault(p, {})
    target[path[-1]] = value
    (tmp / "c.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    _check(_plan(tmp / "c.yaml", tmp / "out"), tmp / "out")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(["node_local", "partitions", "burst_buffer", "containers", "prologue", "launcher",
                            "default_partition", "signal_before_timeout", "filesystems", "tools"]), value=VALUE)
def test_fuzzed_profile_values(tmp_path_factory, key, value):
    tmp = tmp_path_factory.mktemp("fp")
    data_dir = tmp / "data"
    data_dir.mkdir()
    (data_dir / "a.raw").write_bytes(b"x")
    (tmp / "site").mkdir()
    (tmp / "site" / "fz.yaml").write_text(yaml.safe_dump({"name": "fz", "extends": "local-test", key: value},
                                                         allow_unicode=True))
    spec = base_spec(data_dir, tmp)
    spec["site"]["profile"] = "fz"
    (tmp / "c.yaml").write_text(yaml.safe_dump(spec))
    env = dict(os.environ, HPCRUN_PROFILE_PATH=str(tmp / "site"))
    _check(_plan(tmp / "c.yaml", tmp / "out", env), tmp / "out")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300))
def test_fuzzed_bytes(tmp_path_factory, raw):
    tmp = tmp_path_factory.mktemp("fb")
    (tmp / "c.yaml").write_bytes(raw)
    _check(_plan(tmp / "c.yaml", tmp / "out"), tmp / "out")
