"""Unit tests of the shifter/apptainer stand-ins (no cluster needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(__file__).resolve().parent / "bin"
SHIFTER = BIN / "shifter"
APPTAINER = BIN / "apptainer"


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("SHIFTER", "SLURM_", "APPTAINER", "SINGULARITY", "HPCRUN_"))}
    e["HPCRUN_CONTAINERS_LOG"] = str(tmp_path / "containers.log")
    e["SHIFTER_STUB_PERNODE_ROOT"] = str(tmp_path / "nodelocal")
    e["XDG_RUNTIME_DIR"] = str(tmp_path / "xdg")
    return e


def run(tool: Path, args: list[str], env: dict, cwd: Path | None = None,
        argv0: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(tool), *args]
    if argv0:
        argv = [argv0, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=30)


def log_records(env: dict) -> list[dict]:
    path = Path(env["HPCRUN_CONTAINERS_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------
# shifter
# --------------------------------------------------------------------------

IMG = "--image=docker:ubuntu:22.04"


@pytest.mark.parametrize("args,expected", [
    ([IMG, "--", "/bin/echo", "hi"], "hi"),
    (["--image", "docker:ubuntu:22.04", "echo", "hi"], "hi"),
    ([IMG, "echo", "-n", "--not-a-shifter-option"], "--not-a-shifter-option"),
    ([IMG, "-e", "FOO=bar", "--env=BAZ=q=x", "--", "sh", "-c", "echo $FOO $BAZ"], "bar q=x"),
    ([IMG, "--workdir=/tmp", "--", "pwd"], "/tmp"),
    ([IMG, "--entrypoint=/bin/echo entry"], "entry"),
    ([IMG, "-m", "mpich,cvmfs", "--", "sh", "-c", "echo $SHIFTER_MODULE"], "mpich,cvmfs"),
    ([IMG, "-v", "--", "sh", "-c", "echo $SHIFTER_IMAGETYPE/$SHIFTER_IMAGE/$SHIFTER_RUNTIME"],
     "docker/ubuntu:22.04/1"),
    ([IMG, "-V", "/tmp:/var/tmp/x", "--", "true"], ""),
    ([IMG, "--volume=/tmp:/mnt:ro;/usr:/data", "--", "sh", "-c",
      "echo $SHIFTER_STUB_VOLUME_MNT $SHIFTER_STUB_VOLUME_DATA"], "/tmp /usr"),
])
def test_shifter_accepts(env, args, expected):
    p = run(SHIFTER, args, env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == expected
    rec = log_records(env)[-1]
    assert rec["ok"] and rec["argv"] == args and rec["tool"] == "shifter"
    assert rec["cwd"] == os.getcwd()


def test_shifter_pernodecache_gets_node_local_dir(env, tmp_path):
    p = run(SHIFTER, [IMG, "--volume=/tmp:/mnt/db:perNodeCache=size=50G", "--",
                      "sh", "-c", "echo $SHIFTER_STUB_VOLUME_MNT_DB"], env)
    assert p.returncode == 0, p.stderr
    d = Path(p.stdout.strip())
    assert d.is_dir() and d.name == "MNT_DB"
    assert str(d).startswith(str(tmp_path / "nodelocal"))


def test_shifter_image_and_volume_from_environment(env):
    env.update(SHIFTER_IMAGE="centos:7", SHIFTER_IMAGETYPE="docker",
               SHIFTER_VOLUME="/tmp:/scratch")
    p = run(SHIFTER, ["sh", "-c", "echo $SHIFTER_IMAGE $SHIFTER_STUB_VOLUME_SCRATCH"], env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "centos:7 /tmp"
    env2 = dict(env, SHIFTER="docker:alpine:3")
    p = run(SHIFTER, ["sh", "-c", "echo $SHIFTER_IMAGE"], env2)
    assert p.stdout.strip() == "alpine:3"


def test_shifter_env_handling(env, tmp_path):
    envfile = tmp_path / "env.list"
    envfile.write_text("# comment\n\nA=1\nB=two words\n")
    env.update(LD_PRELOAD="/lib/x.so", TMPDIR="/tmp/t", KEEP="yes")
    p = run(SHIFTER, [IMG, f"--env-file={envfile}", "-e", "B=override", "--", "sh", "-c",
                      'echo "$A|$B|${LD_PRELOAD-unset}|${TMPDIR-unset}|$KEEP"'], env)
    assert p.stdout.strip() == "1|override|unset|unset|yes"
    p = run(SHIFTER, [IMG, "-E", "-e", "ONLY=1", "--", "/usr/bin/env"], env)
    assert p.returncode == 0, p.stderr
    keys = {line.split("=", 1)[0] for line in p.stdout.splitlines()}
    assert "KEEP" not in keys and "ONLY" in keys


def test_shifter_help(env):
    p = run(SHIFTER, ["--help"], env)
    assert p.returncode == 0 and "Usage: shifter" in p.stdout


@pytest.mark.parametrize("args,message", [
    (["--image=ubuntu", "true"], "Invalid image input: must specify image type"),
    (["--image=docker:", "true"], "Invalid image input"),
    (["true"], "no image specified"),
    ([IMG, "--volume=/does/not/exist:/mnt", "true"], "does not exist"),
    ([IMG, "-V", "relative:/mnt", "true"], "must be an absolute path"),
    ([IMG, "-V", "/tmp:/etc", "true"], "is not allowed"),
    ([IMG, "-V", "/tmp:/var/spool", "true"], "is not allowed"),
    ([IMG, "-V", "/tmp:/opt", "true"], "is not allowed"),
    ([IMG, "-V", "/tmp:/opt/udiImage/modules", "true"], "is not allowed"),
    ([IMG, "-V", "/tmp", "true"], "expected /source:/destination"),
    ([IMG, "-V", "/tmp:/mnt:perNodeCache=size=0", "true"], "Invalid size for perNodeCache"),
    ([IMG, "-V", "/tmp:/mnt:perNodeCache=size=5X", "true"], "Invalid size for perNodeCache"),
    ([IMG, "-V", "/tmp:/mnt:perNodeCache=size=5G,fs=ext4", "true"], "only fs=xfs"),
    ([IMG, "-V", "/tmp:/mnt:perNodeCache=size=5G,method=nbd", "true"], "only method=loop"),
    ([IMG, "-V", "/tmp:/mnt:perNodeCache=fs=xfs", "true"], "size= is required"),
    ([IMG, "-V", "/tmp:/mnt:slave", "true"], "reserved for site configuration"),
    ([IMG, "-V", "/tmp:/mnt:bogus", "true"], "unknown flag"),
    ([IMG, "-e", "NOEQUALS", "true"], "is not VAR=VALUE"),
    ([IMG, "--env=1BAD=x", "true"], "not a valid variable name"),
    ([IMG, "--env-file=/does/not/exist", "true"], "--env-file"),
    ([IMG, "--workdir=relative", "true"], "must be an absolute path"),
    ([IMG, "--workdir=/does/not/exist", "true"], "no such directory on this host"),
    ([IMG, "--entrypoint"], "--entrypoint without a command"),
    ([IMG, "--bogus", "true"], "unrecognized option '--bogus'"),
    ([IMG, "-x", "true"], "invalid option -- 'x'"),
    ([IMG, "-m", "bad module", "true"], "--module"),
    (["--image"], "requires an argument"),
])
def test_shifter_rejects(env, args, message):
    p = run(SHIFTER, args, env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("shifter: ")
    assert message in p.stderr, p.stderr
    rec = log_records(env)[-1]
    assert rec["ok"] is False and message in rec["error"]


# --------------------------------------------------------------------------
# apptainer
# --------------------------------------------------------------------------


@pytest.fixture
def sif(tmp_path) -> Path:
    p = tmp_path / "app.sif"
    p.write_bytes(b"")
    return p


def test_apptainer_exec_run_shell(env, sif, tmp_path):
    p = run(APPTAINER, ["exec", str(sif), "echo", "hi"], env)
    assert (p.returncode, p.stdout) == (0, "hi\n"), p.stderr
    p = run(APPTAINER, ["exec", "-B", "/tmp:/data:ro,/usr", "--bind=/etc/hostname",
                        "--env", "A=1,B=2", "--env=C=3", "--cleanenv", "--contain",
                        "-W", str(tmp_path), "--writable-tmpfs", str(sif),
                        "sh", "-c", "echo $A$B$C $APPTAINER_NAME"], env)
    assert (p.returncode, p.stdout.strip()) == (0, "123 app.sif"), p.stderr
    p = run(APPTAINER, ["run", "--nv", str(sif), "echo", "ran"], env)
    assert p.stdout == "ran\n"
    p = run(APPTAINER, ["run", str(sif)], env)
    assert (p.returncode, p.stdout) == (0, "")
    p = run(APPTAINER, ["shell", str(sif)], dict(env, SHELL="/bin/true"))
    assert p.returncode == 0, p.stderr
    p = run(APPTAINER, ["-q", "exec", "--overlay", f"{tmp_path}:ro", str(tmp_path), "true"], env)
    assert p.returncode == 0, p.stderr  # sandbox directory image, read-only overlay
    recs = log_records(env)
    assert [r["argv"][0] for r in recs] == ["exec", "exec", "run", "run", "shell", "-q"]
    assert all(r["ok"] for r in recs)


def test_apptainer_cleanenv_drops_host_variables(env, sif):
    env.update(HOSTVAR="x", APPTAINERENV_INNER="y")
    p = run(APPTAINER, ["exec", "-e", str(sif), "sh", "-c", 'echo "${HOSTVAR-unset} $INNER"'],
            env)
    assert p.stdout.strip() == "unset y"
    p = run(APPTAINER, ["exec", str(sif), "sh", "-c", 'echo "$HOSTVAR"'], env)
    assert p.stdout.strip() == "x"


def test_apptainer_pull_build_instance(env, tmp_path):
    p = run(APPTAINER, ["pull", "docker://alpine:3.18"], env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "alpine_3.18.sif").is_file()
    p = run(APPTAINER, ["pull", "docker://alpine:3.18"], env, cwd=tmp_path)
    assert p.returncode == 2 and "already exists" in p.stderr
    p = run(APPTAINER, ["pull", "--force", "docker://alpine:3.18"], env, cwd=tmp_path)
    assert p.returncode == 0
    p = run(APPTAINER, ["pull", "my.sif", "docker://library/ubuntu"], env, cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "my.sif").exists()
    p = run(APPTAINER, ["pull", "--dir", str(tmp_path), "docker://ubuntu"], env)
    assert p.returncode == 0 and (tmp_path / "ubuntu_latest.sif").exists()
    p = run(APPTAINER, ["build", "built.sif", "docker://ubuntu:22.04"], env, cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "built.sif").exists()
    p = run(APPTAINER, ["build", "--sandbox", "sb", "built.sif"], env, cwd=tmp_path)
    assert p.returncode == 0 and (tmp_path / "sb").is_dir()
    sif = str(tmp_path / "built.sif")
    assert run(APPTAINER, ["instance", "start", "-B", "/tmp", sif, "db"], env).returncode == 0
    assert run(APPTAINER, ["instance", "start", sif, "db"], env).returncode == 2
    p = run(APPTAINER, ["instance", "list"], env)
    assert "db" in p.stdout and sif in p.stdout
    assert run(APPTAINER, ["instance", "stop", "db"], env).returncode == 0
    assert run(APPTAINER, ["instance", "stop", "db"], env).returncode == 2
    assert run(APPTAINER, ["instance", "stop", "--all"], env).returncode == 0


def test_singularity_name(env, sif, tmp_path):
    link = tmp_path / "singularity"  # the harness installs a symlink; a copy works too
    link.write_text(APPTAINER.read_text())
    link.chmod(0o755)
    p = run(APPTAINER, ["exec", str(sif), "true"], env, argv0=str(link))
    assert p.returncode == 0, p.stderr
    assert log_records(env)[-1]["tool"] == "singularity"


@pytest.mark.parametrize("args,message", [
    ([], "no command given"),
    (["frobnicate"], "unknown command \"frobnicate\""),
    (["exec"], "missing image"),
    (["exec", "{sif}"], "missing command"),
    (["exec", "/does/not/exist.sif", "true"], "no such file or directory"),
    (["exec", "docker://alpine", "true"], "remote images are not supported"),
    (["exec", "{notsif}", "true"], "not a SIF"),
    (["exec", "-B", "/does/not/exist:/x", "{sif}", "true"], "doesn't exist"),
    (["exec", "-B", "/tmp:relative", "{sif}", "true"], "must be an absolute path"),
    (["exec", "-B", "/tmp:/x:rx", "{sif}", "true"], "is not ro or rw"),
    (["exec", "--bind", "/tmp:/a:b:c", "{sif}", "true"], "expected src[:dst[:ro|rw]]"),
    (["exec", "--env", "NOEQUALS", "{sif}", "true"], "is not VAR=VALUE"),
    (["exec", "--env-file", "/does/not/exist", "{sif}", "true"], "--env-file"),
    (["exec", "-W", "/does/not/exist", "{sif}", "true"], "--workdir"),
    (["exec", "--overlay", "/does/not/exist.img", "{sif}", "true"], "--overlay"),
    (["exec", "--bogus", "{sif}", "true"], "unknown flag: --bogus"),
    (["exec", "-Z", "{sif}", "true"], "unknown shorthand flag"),
    (["exec", "--bind"], "flag needs an argument"),
    (["shell", "{sif}", "extra"], "takes exactly one argument"),
    (["instance"], "missing subcommand"),
    (["instance", "start", "{sif}"], "instance start"),
    (["instance", "stop"], "instance stop"),
    (["pull", "alpine:3"], "is not a URI"),
    (["pull", "docker://"], "invalid image reference"),
    (["build", "out.sif"], "build: usage"),
    (["build", "out.sif", "/does/not/exist.def"], "does not exist"),
    (["build", "out.img.tar", "docker://x"], "should end in .sif"),
])
def test_apptainer_rejects(env, sif, tmp_path, args, message):
    notsif = tmp_path / "data.txt"
    notsif.write_text("x")
    args = [a.format(sif=sif, notsif=notsif) for a in args]
    p = run(APPTAINER, args, env, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("FATAL:")
    assert message in p.stderr, p.stderr
    assert log_records(env)[-1]["ok"] is False
