"""hpcrun plan / profiles / schema through the CLI: outputs, atomic writes, --diff, --json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO


def test_plan_json_summary(cli, spec_factory, tmp_path):
    spec = spec_factory(inputs=4)
    out = tmp_path / "plan"
    result = cli("plan", str(spec), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["totals"]["jobs"] == 4 and data["totals"]["inputs"] == 4
    # local-test is shared: each job holds one CPU per chain (2), not the node's 8 (issue 40)
    assert data["totals"]["core_hours"] == 4 * 2 * 0.5
    assert data["plan_dir"] == str(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["path"] for s in manifest["scripts"]] == data["scripts"] == ["jobs/array001.sbatch"]
    assert len(manifest["scripts"][0]["sha256"]) == 64
    assert (out / "logs").is_dir() and (out / "run").is_dir()
    assert os.access(out / "jobs/array001.sbatch", os.X_OK)


def test_plan_table_summary(cli, spec_factory, tmp_path):
    result = cli("plan", str(spec_factory()), "--out", str(tmp_path / "p"))
    assert result.exit_code == 0
    for word in ("jobs", "core-hours", "burst buffer", "bytes to stage"):
        assert word in result.output


def test_default_out_dir_is_relative_to_cwd(spec_factory, tmp_path):
    spec = spec_factory()
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "hpcrun.cli", "plan", str(spec)], cwd=tmp_path,
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "test-campaign.plan" / "manifest.json").is_file()


def test_diff_against_previous_plan(cli, spec_factory, tmp_path):
    out = tmp_path / "p"
    spec = spec_factory()
    assert cli("plan", str(spec), "--out", str(out)).exit_code == 0
    same = cli("plan", str(spec), "--out", str(out), "--diff")
    assert "no changes against the previous plan" in same.output
    data = yaml.safe_load(spec.read_text())
    data["walltime"] = "00:45:00"
    spec.write_text(yaml.safe_dump(data))
    changed = cli("plan", str(spec), "--out", str(out), "--diff")
    assert "-#SBATCH --time=00:30:00" in changed.output
    assert "+#SBATCH --time=00:45:00" in changed.output
    assert "--- a/jobs/array001.sbatch" in changed.output
    assert "#SBATCH --time=00:45:00" in (out / "jobs/array001.sbatch").read_text()
    as_json = json.loads(cli("plan", str(spec), "--out", str(out), "--json", "--diff").output)
    assert as_json["diff"] == ""


def test_replanning_removes_stale_scripts(spec_factory, tmp_path):
    out = tmp_path / "p"
    files = [{"path": f"/data/run{i}.raw", "size": "1GB", "events": 10} for i in range(3)]
    spec = spec_factory({"jobs": {"array": "never"}, "inputs": {"glob": None, "files": files}})
    write_plan(load_plan(spec), out)
    assert len(list((out / "jobs").glob("*.sbatch"))) == 3
    spec = spec_factory({"jobs": {"array": "never"}, "inputs": {"glob": None, "files": files[:2]}})
    write_plan(load_plan(spec), out)
    assert sorted(p.name for p in (out / "jobs").glob("*.sbatch")) == ["job00001.sbatch", "job00002.sbatch"]


def test_refuses_foreign_or_submitted_directory(cli, spec_factory, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    result = cli("plan", str(spec_factory()), "--out", str(foreign))
    assert result.exit_code == 2 and "holds no hpcrun plan" in result.output
    assert (foreign / "thesis.tex").read_text() == "precious"
    out = tmp_path / "p"
    assert cli("plan", str(spec_factory()), "--out", str(out)).exit_code == 0
    from hpcrun.store.records import NewInput
    from hpcrun.store.store import open_store
    with open_store(out) as store:  # what `hpcrun submit` leaves: a campaign state store
        c = store.register_campaign("x", "s", "p")
        store.add_inputs(c.id, [NewInput("/raw/a")])
    again = cli("plan", str(spec_factory()), "--out", str(out))
    assert again.exit_code == 2 and "already submitted" in again.output
    assert cli("plan", str(spec_factory()), "--out", str(out), "--force").exit_code == 0
    with open_store(out) as store:  # --force replaced the plan but kept every record
        assert [i.path for i in store.inputs(store.get_campaign("x").id)] == ["/raw/a"]


def test_failed_render_leaves_previous_plan_intact(spec_factory, tmp_path, monkeypatch):
    out = tmp_path / "p"
    write_plan(load_plan(spec_factory()), out)
    before = (out / "manifest.json").read_text()
    import hpcrun.render.plandir as plandir

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(plandir.Path, "write_text", boom)
    try:
        write_plan(load_plan(spec_factory()), out)
    except RuntimeError:
        pass
    monkeypatch.undo()
    assert (out / "manifest.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir() if "hpcrun-" in p.name] == []


def test_profiles_list_and_show(cli):
    listed = cli("profiles", "list")
    assert listed.exit_code == 0
    for name in ("nersc-cori-haswell", "nersc-perlmutter", "generic-apptainer", "local-test"):
        assert name in listed.output
    raw = cli("profiles", "show", "nersc-cori-knl")
    assert raw.output.startswith("name: nersc-cori-knl")
    resolved = cli("profiles", "show", "nersc-cori-knl", "--resolved")
    data = yaml.safe_load(resolved.output)
    assert data["partitions"]["regular"]["cores_per_node"] == 68      # from the child
    assert data["burst_buffer"]["system"] == "datawarp"                # from the parent
    assert data["containers"]["shifter"]["per_node_cache_max"] == "200GiB"  # units kept
    assert "nersc-cori-knl.yaml <- " in resolved.output


def test_profiles_list_json(cli, tmp_path, monkeypatch):
    (tmp_path / "broken.yaml").write_text("name: broken\npartitions: 3\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(tmp_path))
    listed = cli("profiles", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.output)}
    knl = rows["nersc-cori-knl"]
    assert knl["valid"] and knl["extends"] == "nersc-cori" and knl["burst_buffer"] == "datawarp"
    assert "regular" in knl["partitions"] and "shifter" in knl["containers"] and knl["scheduler"] == "slurm"
    assert rows["broken"]["valid"] is False and "partitions" in rows["broken"]["error"]


def test_profile_layering_override_order(tmp_path, monkeypatch):
    from hpcrun.model.profiles import load_profile
    d = tmp_path / "p"
    d.mkdir()
    (d / "mid.yaml").write_text("name: mid\nextends: local-test\nmax_array_size: 7\n"
                                "partitions:\n  debug:\n    max_walltime: 2h\n")
    (d / "leaf.yaml").write_text("name: leaf\nextends: mid\nmax_array_size: 9\n"
                                 "filesystems: {}\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(d))
    loaded = load_profile("leaf")
    p = loaded.profile
    assert p.name == "leaf" and p.max_array_size == 9
    assert p.partitions["debug"].max_walltime == 7200 and p.partitions["debug"].cores_per_node == 8
    assert p.filesystems["scratch"].path  # empty mapping merges, keeps parent's keys
    assert [f.stem for f in loaded.files] == ["leaf", "mid", "local-test"]
    assert loaded.source.where(("max_array_size",))[0].endswith("leaf.yaml")
    assert loaded.source.where(("partitions", "debug", "nodes"))[0].endswith("local-test.yaml")


def test_schema_commands(cli):
    for kind, key in (("campaign", "burst_buffer"), ("profile", "partitions")):
        result = cli("schema", kind)
        schema = json.loads(result.output)
        assert key in schema["properties"]
    profile = json.loads(cli("schema", "profile").output)
    assert "podman-hpc" in json.dumps(profile)


def test_internal_errors_are_reported_without_traceback(spec_factory, tmp_path, monkeypatch):
    import hpcrun.plan.load
    monkeypatch.setattr(hpcrun.plan.load, "plan", lambda *a, **k: 1 / 0)
    from click.testing import CliRunner

    from hpcrun.cli import main
    result = CliRunner().invoke(main, ["plan", str(spec_factory()), "--out", str(tmp_path / "p")])
    assert result.exit_code == 70
    assert "internal error: ZeroDivisionError" in result.output
    assert "Traceback" not in result.output


def test_examples_readme_command(tmp_path):
    """The README's first command works from outside the source tree."""
    proc = subprocess.run([sys.executable, "-m", "hpcrun.cli", "plan",
                           str(REPO / "examples/star-cori/campaign.yaml"), "--out", str(tmp_path / "x")],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "core-hours" in proc.stdout
    assert len(list((tmp_path / "x/jobs").glob("*.sbatch"))) == 40
    assert Path(tmp_path / "x/bin/hpcrun-db.sh").is_file()
