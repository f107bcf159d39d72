"""Rendered sweep jobs: directives, bash -n, shellcheck, quoting of hostile paths (by running
the job with bash), Darshan through Shifter, IOR launch lines, and refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcrun.backends.burstbuffer.grammar import check_line, check_script

from .conftest import shellcheck_cmd

# fio, named: with a real IOR on PATH, --engine auto would pick IOR (tests never depend on what is installed)
FIO_RUN = ("iotune", "run", "--engine", "fio")


@pytest.fixture(autouse=True)
def _private_history(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCRUN_IOTUNE_HISTORY", str(tmp_path / "history.jsonl"))


HOSTILE = "it's a \"dir\" with $(touch PWNED) `touch PWNED2` ;&| *?[x] \\ $HOME"


def _lint(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    proc = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "style", str(script)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _render(cli, out: Path, *args: str) -> str:
    res = cli(*FIO_RUN, *args, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["dir"] == str(out)
    return (out / "iotune.sbatch").read_text()


def test_bb_vs_scratch_job_on_local_test(cli, tmp_path):
    text = _render(cli, tmp_path / "sweep", "bb-vs-scratch", "--profile", "local-test")
    _lint(tmp_path / "sweep" / "iotune.sbatch")
    lines = text.splitlines()
    assert check_script(lines, "#DW", job_directive="#SBATCH") == []
    dw = [ln for ln in lines if ln.startswith("#DW ")]
    # largest bb point: 64 MiB x 16 writers x 1.25 = 1.25 GiB -> 2 GiB at 1 GiB granularity
    assert dw == ["#DW jobdw capacity=2GiB access_mode=striped type=scratch pool=wlm_pool"]
    assert check_line(dw[0]) is None
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --time=01:00:00" in lines
    assert 'TARGET_DIR="${DW_JOB_STRIPED%/}"/hpcrun-iotune' in lines
    assert 'TARGET_DIR=/tmp/hpcrun-test-cluster/pfs/hpcrun-iotune."${HPCRUN_JOB_ID:-$$}"' in lines
    manifest = json.loads((tmp_path / "sweep" / "iotune.json").read_text())
    assert manifest["kind"] == "hpcrun-iotune" and len(manifest["points"]) == 2 * 5 * 3
    assert len(manifest["steps"]) == 30 * 3 * 2 and manifest["engine"]["name"] == "fio"
    assert manifest["bb_capacity_bytes"] == 2 * 2**30


@pytest.mark.parametrize("profile, targets", [
    ("nersc-cori-haswell", ["bb", "scratch"]), ("nersc-cori-knl", ["bb", "node-local"]),
    ("nersc-perlmutter", ["scratch"]), ("generic-apptainer", ["node-local", "/data/x y"]),
])
def test_jobs_for_shipped_profiles_lint(cli, tmp_path, profile, targets):
    args = ["quick", "--profile", profile, "--engine", "fio"]   # NERSC profiles name IOR (auto: ior)
    for t in targets:
        args += ["--target", t]
    text = _render(cli, tmp_path / "s", *args)
    _lint(tmp_path / "s" / "iotune.sbatch")
    assert check_script(text.splitlines(), "#DW", job_directive="#SBATCH") == []
    assert ("#DW jobdw" in text) == ("bb" in targets)


def test_hostile_target_is_created_literally_by_the_job(cli, tmp_path):
    """Render, lint, then run the job with bash (no Slurm): the hostile directory must be used
    byte for byte and nothing in its name may run."""
    base = tmp_path / "base"
    base.mkdir()
    target = base / HOSTILE
    target.mkdir()
    bb = tmp_path / "bb"
    bb.mkdir()
    sweep = tmp_path / "sweep $(x)"
    _render(cli, sweep, "--transfer-size", "64k,1m", "--block-size", "1m", "--writers", "1", "--target", "bb",
            "--target", str(target), "--profile", "local-test")
    _lint(sweep / "iotune.sbatch")
    env = dict(os.environ, DW_JOB_STRIPED=str(bb) + "/", SLURM_JOB_ID="4242")
    proc = subprocess.run(["bash", str(sweep / "iotune.sbatch")], cwd=base, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not any(p.name.startswith("PWNED") for p in list(base.iterdir()) + list(tmp_path.iterdir()))
    assert (sweep / "raw" / "target-1.path").read_text() == f"{target}/hpcrun-iotune.4242\n"
    assert (sweep / "raw" / "target-0.path").read_text() == f"{bb}/hpcrun-iotune\n"
    assert target.is_dir() and list(target.iterdir()) == []        # the sweep cleaned up after itself
    assert not (bb / "hpcrun-iotune").exists()
    res = cli("iotune", "collect", str(sweep), "--json", env={"HPCRUN_IOTUNE_HISTORY": str(tmp_path / "h")})
    assert res.exit_code == 0, res.output
    results = json.loads(res.output)
    assert [t["run_path"] for t in results["targets"]] == [f"{bb}/hpcrun-iotune", f"{target}/hpcrun-iotune.4242"]
    assert all(r["error"] is None and r["bw_mib_mean"] > 0 for r in results["results"])
    assert results["environment"]["slurm_job_id"] == "4242"


def _darshan_profile(tmp_path: Path, lib: str = "/opt/darshan/lib/libdarshan.so") -> Path:
    path = tmp_path / "dsite.yaml"
    path.write_text(f"extends: local-test\nname: dsite\ntools:\n  darshan_lib: {lib}\n")
    return path


def test_darshan_through_shifter_env_and_plain_env(cli, tmp_path):
    prof = str(_darshan_profile(tmp_path))
    text = _render(cli, tmp_path / "a", "quick", "--darshan", "--profile", prof, "--container", "shifter",
                   "--image", "docker:me/fio:1", "--target", "/tmp/x")
    _lint(tmp_path / "a" / "iotune.sbatch")
    assert "#SBATCH --image=docker:me/fio:1" in text
    step = next(ln for ln in text.splitlines() if ln.startswith("run_step p0001-write-r1 "))
    assert ("shifter --env=LD_PRELOAD=/opt/darshan/lib/libdarshan.so --env=DARSHAN_ENABLE_NONMPI=1 "
            '--env=DARSHAN_LOGPATH="$RAW"/darshan/p0001-write-r1 fio ') in step
    assert 'mkdir -p "$RAW"/darshan/p0001-write-r1' in text
    assert "export LD_PRELOAD" not in text
    text = _render(cli, tmp_path / "b", "quick", "--darshan", "--profile", prof, "--target", "/tmp/x")
    step = next(ln for ln in text.splitlines() if ln.startswith("run_step p0001-read-r1 "))
    assert "p0001-read-r1.json env LD_PRELOAD=/opt/darshan/lib/libdarshan.so DARSHAN_ENABLE_NONMPI=1" in step
    assert "DARSHAN_LIB=/opt/darshan/lib/libdarshan.so\n[ -r \"$DARSHAN_LIB\" ] || fail 3" in text


def test_darshan_without_library_is_refused(cli, tmp_path):
    res = cli(*FIO_RUN, "quick", "--darshan", "--profile", "local-test", "--out", str(tmp_path / "o"))
    assert res.exit_code == 2
    assert "tools.darshan_lib" in res.output and "local-test.yaml" in res.output
    assert not (tmp_path / "o").exists()
    res = cli(*FIO_RUN, "quick", "--darshan", "--local", "--profile", str(_darshan_profile(
        tmp_path, "/nonexistent/libdarshan.so")), "--target", str(tmp_path), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "does not exist on this node" in res.output
    assert not (tmp_path / "o").exists()


def test_refusals_write_nothing(cli, tmp_path):
    out = tmp_path / "o"
    res = cli(*FIO_RUN, "quick", "--local", "--target", "bb", "--out", str(out))
    assert res.exit_code == 2 and "burst buffer exists only inside a batch job" in res.output
    res = cli(*FIO_RUN, "quick", "--profile", "generic-apptainer", "--target", "bb", "--out", str(out))
    assert res.exit_code == 2 and "burst_buffer.system" in res.output and "no burst" in res.output
    res = cli(*FIO_RUN, "quick", "--out", str(out))
    assert res.exit_code == 2 and "--profile" in res.output
    res = cli(*FIO_RUN, "quick", "--profile", "local-test", "--walltime", "3h", "--out", str(out))
    assert res.exit_code == 2 and "--walltime" in res.output and "exceeds" in res.output
    res = cli(*FIO_RUN, "quick", "--profile", "local-test", "--target", "/a:b", "--out", str(out))
    assert res.exit_code == 2 and "':'" in res.output
    assert not out.exists()
    assert "Traceback" not in res.output
    out.mkdir()
    (out / "precious.txt").write_text("x")
    res = cli(*FIO_RUN, "quick", "--profile", "local-test", "--out", str(out))
    assert res.exit_code == 2 and "holds no hpcrun sweep" in res.output
    assert [p.name for p in out.iterdir()] == ["precious.txt"]


def test_bare_group_prints_subcommands(cli):
    res = cli("iotune")
    assert res.exit_code == 0
    for sub in ("run", "collect", "history"):
        assert sub in res.output


def test_ior_engine_lines_pass_iors_grammar(cli, tmp_path):
    """The IOR launch line of a rendered sweep: srun with nodes x writers, the point directory
    and summary file as run-time variables, and an IOR argv that IOR 4.0's grammar accepts."""
    import shlex

    from hpcrun.iotune.engines.ior_argv import check_ior_argv

    text = _render(cli, tmp_path / "s", "--transfer-size", "1m", "--writers", "4", "--nodes", "1", "--reps", "3",
                   "--api", "mpiio", "--engine", "ior", "--target", "/scratch/x", "--profile", "local-test")
    _lint(tmp_path / "s" / "iotune.sbatch")
    step = next(ln for ln in text.splitlines() if ln.startswith("run_step p0001 "))
    # the profile's MPI launch option (local-test: PMIx, how Debian's Open MPI starts under srun) first
    assert step.startswith("run_step p0001 p0001.json.log srun --mpi=pmix --nodes=1 --ntasks=4 --ntasks-per-node=4 ")
    words = shlex.split(step.replace('"$POINT_DIR"', "/pd").replace('"$RAW"', "/raw"))
    ior_argv = words[words.index("--ntasks-per-node=4") + 1:]
    args = check_ior_argv(ior_argv)  # raises with every problem when IOR would refuse the line
    assert args is not None
    joined = " ".join(ior_argv)
    for part in ("-a MPIIO", "-t 1m", "-i 3", "-F", "-e", "-o /pd/ior.dat", "summaryFormat=JSON",
                 "summaryFile=/raw/p0001.json"):
        assert part in joined, (part, joined)
    assert "-v" not in ior_argv  # never verbose together with a JSON summary


def test_collect_refuses_unfinished_and_reports_bad_points(cli, tmp_path):
    sweep = tmp_path / "s"
    _render(cli, sweep, "--transfer-size", "64k,1m", "--block-size", "1m", "--write", "--target", "/tmp/x",
            "--profile", "local-test")
    res = cli("iotune", "collect", str(sweep))
    assert res.exit_code == 2 and "has not finished" in res.output
    raw = sweep / "raw"
    raw.mkdir(exist_ok=True)
    good = {"fio version": "fio-3.33", "jobs": [{"error": 0, "write": {"bw_bytes": 2**20 * 10, "io_bytes": 2**20,
                                                                       "iops": 10.0}}]}
    (raw / "p0001-write-r1.json").write_text(json.dumps(good))
    (raw / "p0001-write-r1.rc").write_text("0\n")
    (raw / "p0002-write-r1.json").write_text(json.dumps(good)[:40])       # truncated
    (raw / "p0002-write-r1.rc").write_text("0\n")
    (raw / "exit_code").write_text("0\n")
    (raw / "engine-version").write_text("fio-3.33\n")
    res = cli("iotune", "collect", str(sweep), "--json", env={"HPCRUN_IOTUNE_HISTORY": str(tmp_path / "h")})
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["results"]
    assert rows[0]["error"] is None and rows[0]["bw_mib_mean"] == 10.0
    assert "truncated" in rows[1]["error"] and "p0002-write-r1" in rows[1]["error"]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_job_records_a_failing_point_and_goes_on(cli, tmp_path):
    sweep = tmp_path / "s"
    (tmp_path / "t").mkdir()
    _render(cli, sweep, "--transfer-size", "64k", "--block-size", "1m", "--write", "--target", str(tmp_path / "t"),
            "--target", "/proc/no-such-dir", "--profile", "local-test")
    proc = subprocess.run(["bash", str(sweep / "iotune.sbatch")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "/proc/no-such-dir does not exist" in (sweep / "raw" / "reason").read_text()
    res = cli("iotune", "collect", str(sweep), "--json", env={"HPCRUN_IOTUNE_HISTORY": str(tmp_path / "h")})
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["results"]
    assert rows[0]["error"] is None and "did not run" in rows[1]["error"]


def test_the_short_form_is_a_sweep_exactly_like_iotune_run(cli, tmp_path):
    """`hpcrun iotune --transfer-size ...` (the documented usage) renders what `iotune run` renders."""
    args = ["--transfer-size", "1m,4m", "--block-size", "16m", "--writers", "1,2", "--profile", "local-test",
            "--target", "scratch", "--name", "short", "--json", "--engine", "fio"]
    long = cli("iotune", "run", *args, "--out", str(tmp_path / "long"))
    short = cli("iotune", *args, "--out", str(tmp_path / "short"))
    assert long.exit_code == 0 and short.exit_code == 0, short.output
    a, b = (json.loads((tmp_path / d / "iotune.json").read_text()) for d in ("long", "short"))
    for m in (a, b):
        m.pop("dir", None)
        m.pop("created", None)
    assert [p for p in a["points"]] == [p for p in b["points"]] and len(a["points"]) == 2 * 2
    assert (tmp_path / "long" / "iotune.sbatch").read_text().replace(str(tmp_path / "long"), "D") == \
        (tmp_path / "short" / "iotune.sbatch").read_text().replace(str(tmp_path / "short"), "D")
    assert cli("iotune", "--help").output.count("Usage:") == 1
