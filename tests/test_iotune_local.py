"""A real fio sweep on this machine: local disk vs tmpfs, 3 transfer sizes, 1 and 2 writers;
results, recommendation, plot, history and the --apply round trip into a site profile."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from hpcrun.model.profiles import load_profile

pytestmark = pytest.mark.skipif(shutil.which("fio") is None or not Path("/dev/shm").is_dir(),
                                reason="needs fio and /dev/shm")

PROFILE = """\
# My lab's cluster. Comments and key order must survive --apply.
name: mylab
extends: local-test          # the test cluster, for partitions and the burst buffer
description: lab profile used by the iotune tests
iotune:
  # scratch for I/O sweeps
  scratch: /tmp
  fio: fio
launcher:
  command: srun
"""


# fio, named: with a real IOR on PATH, --engine auto would pick IOR (tests never depend on what is installed)
FIO_RUN = ("iotune", "run", "--engine", "fio")


def test_real_fio_sweep_disk_vs_tmpfs(cli, tmp_path, monkeypatch):
    history = tmp_path / "history.jsonl"
    monkeypatch.setenv("HPCRUN_IOTUNE_HISTORY", str(history))
    disk = tmp_path / "disk"
    disk.mkdir()
    profile = tmp_path / "mylab.yaml"
    profile.write_text(PROFILE)
    out = tmp_path / "sweep"
    started = time.monotonic()
    res = cli(*FIO_RUN, "--local", "--name", "ci", "--transfer-size", "64k,256k,1m", "--writers", "1,2",
              "--block-size", "4m", "--target", str(disk), "--target", "/dev/shm", "--out", str(out),
              "--apply", str(profile), "--json")
    elapsed = time.monotonic() - started
    assert res.exit_code == 0, res.output
    assert elapsed < 30, f"the CI sweep took {elapsed:.1f} s"
    results = json.loads(res.output)

    # every point measured, both targets, both operations
    rows = results["results"]
    assert len(rows) == 2 * 3 * 2 * 2
    assert all(r["error"] is None and r["bw_mib_mean"] > 0 for r in rows), [r["error"] for r in rows]
    assert {r["target"] for r in rows} == {str(disk), "/dev/shm"}
    assert {(r["transfer"], r["writers"]) for r in rows} == {(t, w) for t in (65536, 262144, 2**20) for w in (1, 2)}
    assert results["engine"]["name"] == "fio" and results["engine"]["version"].startswith("fio-")
    by_name = {t["name"]: t for t in results["targets"]}
    assert by_name["/dev/shm"]["fstype"] == "tmpfs"
    assert by_name[str(disk)]["run_path"].startswith(str(disk) + "/hpcrun-iotune.")
    assert results["environment"]["node"] and results["environment"]["date"]
    assert list(disk.iterdir()) == []                                   # cleaned up

    # files: results.json equals what was printed (minus file names), the plot is a PNG
    stored = json.loads((out / "results.json").read_text())
    assert stored["results"] == rows and stored["sweep_id"] == results["sweep_id"]
    png = (out / "bandwidth.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert results["plot_file"] == str(out / "bandwidth.png")

    # the recommendation: best write point, and the smallest transfer within 5% of it
    rec = results["recommendation"]
    assert rec["operation"] == "write"
    writes = [r for r in rows if r["operation"] == "write"]
    best = max(writes, key=lambda r: r["bw_mib_mean"])
    assert rec["overall"]["best"]["bw_mib_mean"] == best["bw_mib_mean"]
    within = [r for r in writes if r["bw_mib_mean"] >= 0.95 * best["bw_mib_mean"]]
    assert rec["overall"]["recommended"]["transfer"] == min(r["transfer"] for r in within)
    assert set(rec["per_target"]) == {str(disk), "/dev/shm"}

    # --apply: the profile keeps its comments and key order, gains iotune.recommended, validates
    text = profile.read_text()
    assert text.startswith(PROFILE.split("launcher:")[0].rstrip("\n").rsplit("\n", 1)[0])
    for line in PROFILE.splitlines():
        assert line in text, line
    assert text.index("iotune:") < text.index("recommended:") < text.index("launcher:")
    loaded = load_profile(str(profile)).profile
    chosen = rec["overall"]["recommended"]
    assert loaded.iotune.recommended is not None
    assert loaded.iotune.recommended.transfer_size == chosen["transfer"]
    assert loaded.iotune.recommended.writers_per_node == chosen["writers"]
    assert loaded.iotune.recommended.target == chosen["target"]
    assert loaded.iotune.scratch == "/tmp" and loaded.extends == "local-test"

    # history: one line; collecting the same sweep again does not add another
    assert len(history.read_text().splitlines()) == 1
    again = cli("iotune", "collect", str(out), "--apply", str(profile), "--json")
    assert again.exit_code == 0, again.output
    assert len(history.read_text().splitlines()) == 1
    assert profile.read_text().count("recommended:") == 1                # replaced, not added twice
    listed = cli("iotune", "history", "--json")
    assert [h["sweep_id"] for h in json.loads(listed.output)] == [results["sweep_id"]]


def test_campaign_job_exports_recommendation(spec_factory, tmp_path, monkeypatch):
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan

    prof_dir = tmp_path / "profiles"
    prof_dir.mkdir()
    (prof_dir / "tuned.yaml").write_text(
        "extends: local-test\nname: tuned\niotune:\n  recommended:\n    transfer_size: 4MiB\n"
        "    writers_per_node: 8\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof_dir))
    spec = spec_factory({"site": {"profile": "tuned"}})
    write_plan(load_plan(spec), tmp_path / "plan")
    script = next((tmp_path / "plan" / "jobs").glob("*.sbatch")).read_text()
    assert f"export HPCRUN_IO_TRANSFER_SIZE={4 * 2**20}" in script
    assert "export HPCRUN_IO_WRITERS_PER_NODE=8" in script


def test_local_run_failure_leaves_no_directory(cli, tmp_path):
    out = tmp_path / "sweep"
    res = cli("iotune", "run", "--local", "--transfer-size", "64k", "--block-size", "1m", "--engine", "fio",
              "--target", "/proc/cannot-write-here", "--out", str(out))
    assert res.exit_code == 2 and "does not exist or is not writable" in res.output
    assert "Traceback" not in res.output
    assert not out.exists() and not list(tmp_path.glob(".sweep*"))
