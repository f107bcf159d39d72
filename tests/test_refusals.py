"""Values a generated line cannot carry, and specs that would lose data, are refused at plan
time with file, line and key (exit 2) -- never an internal error, never a silent plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcrun.errors import InputError
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan


def _problems(spec: Path):
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    return exc.value.problems


def _one(spec: Path, key: str, fragment: str):
    problems = _problems(spec)
    hits = [p for p in problems if p.key == key]
    assert hits, [p.render() for p in problems]
    assert fragment in hits[0].message, hits[0].render()
    assert hits[0].line is not None
    return hits[0]


@pytest.mark.parametrize("image", ['docker:repo/x:1"', "docker:repo/x:1\t2"])
def test_shifter_image_the_sbatch_line_cannot_carry(spec_factory, image):
    spec = spec_factory({"container": {"runtime": "shifter", "image": image}})
    _one(spec, "container.image", "cannot be written into an #SBATCH line")


def test_profile_constraint_with_a_quote_is_a_profile_error(spec_factory, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "q.yaml").write_text('name: q\nextends: local-test\npartitions:\n  debug:\n'
                                 '    constraint: \'has"quote\'\n')
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(site))
    p = _one(spec_factory({"site": {"profile": "q"}}), "partitions.debug.constraint", "#SBATCH")
    assert p.file.endswith("q.yaml")


@pytest.mark.parametrize("command,fragment", [([":"], "no program of that name"),
                                              (["exit", "3"], "no program of that name"),
                                              (["source", "x.sh"], "inside the job's own shell")])
def test_a_chain_command_that_names_no_program_is_refused(spec_factory, command, fragment):
    """The chain's command is run as a program (exec'd): a builtin with no program of its name would end every
    input with 127, and one that acts on the job's shell would run in it; both are refused at plan time."""
    _one(spec_factory({"chain": {"command": command}}), "chain.command", fragment)


def test_extra_sbatch_tab_is_refused(spec_factory):
    _one(spec_factory({"site": {"extra_sbatch": ["--mail-user=a\tb"]}}), "site.extra_sbatch.0",
         "control character")


@pytest.mark.parametrize("out", ['plan"x', "plan\nx"])
def test_out_dir_the_output_line_cannot_carry(cli, spec_factory, tmp_path, out):
    result = cli("plan", str(spec_factory()), "--out", str(tmp_path / out))
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "#SBATCH --output" in result.output
    assert "internal error" not in result.output
    assert not any(p.name.startswith(("plan", ".plan")) for p in tmp_path.iterdir())


@pytest.mark.parametrize("pattern, fragment", [
    ("same.root", "same output name"),
    ("{stem}\t.out", "control character"),
    ("..", "same output name"),
])
def test_output_patterns_that_lose_data(spec_factory, pattern, fragment):
    _one(spec_factory({"outputs": {"pattern": pattern}}), "outputs.pattern", fragment)


def test_output_names_must_differ_across_the_campaign(spec_factory, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "run.raw").write_bytes(b"x")
    spec = spec_factory({"inputs": {"glob": None, "files": [str(tmp_path / "a/run.raw"),
                                                             str(tmp_path / "b/run.raw")]},
                         "outputs": {"pattern": "{name}.out"}})
    problems = _problems(spec)
    assert any("run.raw" in p.message for p in problems), [p.render() for p in problems]


def test_input_name_with_a_tab_is_refused_not_a_false_checksum_mismatch(spec_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "run\tA.raw").write_bytes(b"x")
    p = _one(spec_factory({"inputs": {"glob": str(data / "*.raw")}}, inputs=0), "inputs.glob", "")
    assert "tab" in p.message.lower()
    p = _one(spec_factory({"inputs": {"glob": None, "size": "1GB", "files": ["/x/run\tB.raw"]}}, inputs=0),
             "inputs.files.0", "")
    assert "tab" in p.message.lower()


def test_explicit_capacity_smaller_than_the_staged_data(spec_factory, tmp_path):
    data = tmp_path / "big"
    data.mkdir()
    spec = spec_factory({"inputs": {"glob": None, "size": "50GB",
                                    "files": [str(data / "a.raw")]},
                         "burst_buffer": {"capacity": "20GB", "stage_inputs": False,
                                          "stage_outputs": True}})
    p = _one(spec, "burst_buffer.capacity", "too small")
    assert "100.0 GB" in p.message and "chain parts 50.0 GB" in p.message


def test_capacity_zero_is_refused(spec_factory):
    _one(spec_factory({"burst_buffer": {"capacity": 0, "stage_inputs": False}}),
         "burst_buffer.capacity", "0 bytes")


def test_stage_path_with_a_control_character(spec_factory):
    spec = spec_factory({"burst_buffer": {"stage_inputs": False, "stage_in": [
        {"source": "/tmp/calib\x01x", "destination": "in/calib"}]}})
    _one(spec, "burst_buffer.stage_in.0.source", "control character")


def test_per_node_cache_in_options_is_not_stacked_on_hpcruns(spec_factory, tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    spec = spec_factory({"container": {"runtime": "shifter", "image": "docker:x/y:1",
                                       "options": ["--volume=/tmp:/c:perNodeCache=size=10G"]},
                         "database": {"payload": str(payload), "size": "1GB"}})
    _one(spec, "container.options.0", "stacked")


def test_rabbit_on_several_nodes_uses_the_shared_type(spec_factory, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "rabbit.yaml").write_text("name: rabbit\nextends: local-test\nburst_buffer:\n"
                                      "  system: rabbit\n  directive: DW\npartitions:\n  debug:\n"
                                      "    max_nodes_per_job: 4\n    nodes: 4\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(site))
    for nodes, kind in ((1, "xfs"), (2, "lustre")):
        plan = load_plan(spec_factory({"site": {"profile": "rabbit"}, "jobs": {"nodes": nodes},
                                       "burst_buffer": {"capacity": "10GB", "stage_inputs": False}}))
        out = write_plan(plan, tmp_path / f"p{nodes}").out_dir
        text = next((out / "jobs").glob("*.sbatch")).read_text()
        assert f"#DW jobdw type={kind} capacity=" in text


def test_diff_without_a_previous_plan_says_so(cli, spec_factory, tmp_path):
    result = cli("plan", str(spec_factory()), "--out", str(tmp_path / "fresh"), "--diff")
    assert result.exit_code == 0
    assert "no previous plan" in result.output
    assert "no changes" not in result.output


def _kill_plan_midway(spec: Path, out: Path, sig: int) -> None:
    """Start hpcrun plan, stop it with ``sig`` once its temporary directory exists."""
    proc = subprocess.Popen([sys.executable, "-m", "hpcrun.cli", "plan", str(spec), "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if any(p.name.startswith(f".{out.name}.hpcrun-tmp-") for p in out.parent.iterdir()):
            break
        time.sleep(0.002)
    proc.send_signal(sig)
    proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_plan_leaves_nothing_the_next_run_keeps(spec_factory, tmp_path, sig):
    spec = spec_factory(inputs=3000)
    out = tmp_path / "p"
    _kill_plan_midway(spec, out, sig)
    assert write_plan(load_plan(spec), out).out_dir == out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".p.")) == []


def test_records_in_a_killed_runs_temporary_directory_come_back(spec_factory, tmp_path):
    """Killed after moving the state store into its temporary directory: nothing is lost."""
    spec = spec_factory()
    out = tmp_path / "p"
    write_plan(load_plan(spec), out)
    debris = tmp_path / ".p.hpcrun-tmp-otherhost-1"
    (debris / "run").mkdir(parents=True)
    (debris / "state.db").write_bytes(b"records")
    os.utime(debris, (0, 0))          # another login node's, and more than a day old
    write_plan(load_plan(spec), out, force=True)
    assert (out / "state.db").read_bytes() == b"records"
    assert not debris.exists()
    assert json.loads((out / "manifest.json").read_text())["campaign"] == "test-campaign"
