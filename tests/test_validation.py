"""Every validation error path: message names file, line, key and what is valid; exit 2."""

from pathlib import Path

import pytest
import yaml

from hpcrun.errors import InputError
from hpcrun.plan.load import load_plan

CASES = [
    # (id, overrides, key, message fragment)
    ("unknown-top", {"walltiem": "1h"}, "walltiem", "Did you mean 'walltime'?"),
    ("unknown-nested", {"site": {"partitoin": "debug"}}, "site.partitoin", "Did you mean 'partition'"),
    ("wrong-type", {"jobs": {"nodes": "2"}}, "jobs.nodes", "expected a whole number, found '2'"),
    ("bad-unit", {"inputs": {"size": "3XB"}}, "inputs.size", "unknown unit"),
    ("bad-duration", {"walltime": "8 hours"}, "walltime", "is not a duration"),
    ("missing-key", {"chain": None}, "chain", "required key 'chain' is missing"),
    ("bad-literal", {"container": {"runtime": "docker"}}, "container.runtime", "use one of"),
    ("relative-glob", {"inputs": {"glob": "data/*.raw"}}, "inputs.glob", "not an absolute path"),
    ("bad-name", {"name": "1st campaign"}, "name", "starts with a letter"),
    ("chains-zero", {"jobs": {"chains_per_node": 0}}, "jobs.chains_per_node", "at least 1"),
    ("auto-no-bytes", {"jobs": {"chains_per_node": "auto"}}, "jobs", "needs bytes_per_chain"),
    ("image-missing", {"container": {"runtime": "shifter"}}, "container", "needs an 'image'"),
    ("shifter-type", {"container": {"runtime": "shifter", "image": "ubuntu"}}, "container", "docker:repo"),
    ("image-none", {"container": {"image": "x.sif"}}, "container", "runtime is 'none'"),
    ("empty-command", {"chain": {"command": []}}, "chain.command", "empty"),
    ("bad-sbatch", {"site": {"extra_sbatch": ["-x foo"]}}, "site.extra_sbatch", "long sbatch option"),
    ("newline", {"software": {"release": "a\nb"}}, "software.release", "single line"),
    ("env-name", {"software": {"env": {"1X": "y"}}}, "software.env", "not a valid environment variable"),
    ("no-inputs", {"inputs": {"glob": None, "events": None}}, "inputs", "at least one of"),
    ("safety", {"burst_buffer": {"safety_factor": 0.5}}, "burst_buffer.safety_factor", "out of range"),
    ("bb-capacity", {"burst_buffer": {"capacity": "3.5XB"}}, "burst_buffer.capacity", "unknown unit"),
    # cross-checks against the profile
    ("partition", {"site": {"partition": "gpu"}}, "site.partition", "valid: debug"),
    ("walltime-max", {"walltime": "02:00:00"}, "walltime", "exceeds the maximum 01:00:00"),
    ("nodes-max", {"jobs": {"nodes": 4}}, "jobs.nodes", "allows at most 3"),
    ("chains-cores", {"jobs": {"chains_per_node": 16}}, "jobs.chains_per_node", "overcommit"),
    ("runtime-offered", {"container": {"runtime": "podman-hpc", "image": "x"}}, "container.runtime",
     "offers: apptainer, charliecloud, shifter, none"),
    ("placeholder", {"chain": {"command": ["reco", "{inptu}"]}}, "chain.command", "Did you mean 'input'"),
    ("parts-in-chain", {"chain": {"command": ["reco", "{parts}"]}}, "chain.command", "unknown placeholder"),
    ("parts-glued", {"merge": {"command": ["m", "x{parts}"]}}, "merge.command", "argument by itself"),
    ("brace", {"chain": {"command": ["reco", "{input"]}}, "chain.command", "unbalanced"),
    ("pattern", {"outputs": {"pattern": "{stemm}.x"}}, "outputs.pattern", "Did you mean 'stem'"),
    ("pattern-slash", {"outputs": {"pattern": "a/{stem}"}}, "outputs.pattern", "cannot contain '/'"),
    ("db-placeholder", {"chain": {"command": ["reco", "{db_socket}"]}}, "chain.command", "no 'database'"),
    ("merge-needed", {"merge": None}, "jobs.chains_per_node", "'merge' command is needed"),
    ("events-unknown", {"inputs": {"events": None}}, "chain.command", "number of events"),
    ("qa-empty", {"qa": {"min_event_fraction": 0.9}}, "qa", "count_events"),
    ("pool", {"burst_buffer": {"pool": "nopool"}}, "burst_buffer.pool", "valid: wlm_pool"),
    ("private-stage", {"burst_buffer": {"access_mode": "private"}}, "burst_buffer.access_mode",
     "cannot stage"),
    ("stage-relative", {"burst_buffer": {"stage_in": [{"source": "calib", "destination": "c",
                                                       "type": "directory"}]}},
     "burst_buffer.stage_in.0.source", "absolute path"),
    ("stage-bb-abs", {"burst_buffer": {"stage_out": [{"source": "/abs", "destination": "/x",
                                                      "type": "file"}]}},
     "burst_buffer.stage_out.0.source", "relative to the buffer"),
    ("capacity-pool-max", {"burst_buffer": {"capacity": "60GiB"}}, "burst_buffer.capacity",
     "that pool 'wlm_pool' can give one job"),
    ("array-stage", {"jobs": {"array": "always"}, "burst_buffer": {"capacity": "1GiB"}}, "jobs.array",
     "per-job #DW"),
    ("db-missing-size", {"database": {"payload": "/nonexistent/payload"}}, "database.payload",
     "give database.size"),
    ("db-too-big", {"database": {"payload": "/nonexistent/p", "size": "100GB"}}, "database.size",
     "node-local storage"),
    ("db-too-big-shifter", {"container": {"runtime": "shifter", "image": "docker:a:b"},
                            "database": {"payload": "/nonexistent/p", "size": "100GB"}},
     "database.size", "perNodeCache"),
    ("cleanenv", {"container": {"runtime": "apptainer", "image": "/x.sif", "options": ["--cleanenv"]}},
     "container.options.0", "clears the environment"),
    ("bare-duration", {"walltime": 30}, "walltime", "has no unit"),
    ("yaml-sexagesimal", {"database": {"payload": "/nonexistent/p", "size": "1MB", "ready_timeout": 600}},
     "database.ready_timeout", "quote colon times"),
    ("managed-sbatch", {"site": {"extra_sbatch": ["--time=9-00:00:00"]}}, "site.extra_sbatch",
     "written by hpcrun from walltime"),
    ("managed-abbrev", {"site": {"extra_sbatch": ["--tim=10"]}}, "site.extra_sbatch", "'--time' is written"),
    ("sbatch-quote", {"site": {"extra_sbatch": ['--mail-user="x"']}}, "site.extra_sbatch", "double quote"),
    ("bb-cache", {"burst_buffer": {"type": "cache"}}, "burst_buffer.type", "not supported yet"),
    ("pattern-env", {"outputs": {"pattern": "{env:HOME}.x"}}, "outputs.pattern", "fixed when the plan"),
    ("qa-events-no-count", {"qa": {"command": ["check", "{events_in}"]}}, "qa.command", "count_events"),
    ("port-socket", {"database": {"payload": "/nonexistent/p", "size": "1MB"},
                     "chain": {"command": ["reco", "{db_port}"]}}, "chain.command", "networking"),
]


@pytest.mark.parametrize("case_id,overrides,key,fragment", CASES, ids=[c[0] for c in CASES])
def test_error_paths(spec_factory, case_id, overrides, key, fragment):
    if case_id == "qa-empty":
        overrides = {"qa": {"min_event_fraction": 0.9}}
    if "burst_buffer" in overrides and case_id not in ("safety", "bb-capacity"):
        overrides = {**overrides, "burst_buffer": {"capacity": "auto", **overrides["burst_buffer"]}}
    spec = spec_factory(overrides)
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    problems = exc.value.problems
    matching = [p for p in problems if p.key == key and fragment in p.message]
    assert matching, f"expected {key!r} / {fragment!r} in:\n{exc.value}"
    p = matching[0]
    assert p.file.endswith(".yaml") and p.line is not None and p.line >= 1


def test_line_numbers_point_at_the_key(spec_factory):
    text = """name: x
site:
  profile: local-test
walltime: 10m
inputs:
  files: [/a/b.raw]
  size: 1GB
chain:
  command: reco {input} {output}
  typo_key: 1
outputs:
  location: /out
"""
    spec = spec_factory(text=text)
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    [p] = exc.value.problems
    assert (p.line, p.key) == (10, "chain.typo_key")
    assert "Valid keys here: command, env, launch." in p.message


def test_several_errors_reported_together(spec_factory):
    spec = spec_factory({"walltiem": 1, "jobs": {"nodes": "x", "chains_per_node": 0}})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert len(exc.value.problems) >= 3
    assert str(exc.value).startswith(f"{len(exc.value.problems)} problems found:")


def test_spec_and_profile_errors_together(tmp_path, spec_factory, monkeypatch):
    prof = tmp_path / "profiles"
    prof.mkdir()
    (prof / "broken.yaml").write_text("name: broken\npartitions: {}\ndefault_partition: x\nbogus: 1\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    spec = spec_factory({"site": {"profile": "broken"}, "walltiem": 3})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    files = {Path(p.file).name for p in exc.value.problems}
    assert files == {"campaign.yaml", "broken.yaml"}


def test_yaml_syntax_error_has_line(spec_factory):
    spec = spec_factory(text="name: x\nsite: [unclosed\nwalltime: 1h\n")
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert exc.value.problems[0].line is not None
    assert "YAML syntax error" in exc.value.problems[0].message


def test_duplicate_key(spec_factory):
    spec = spec_factory(text="name: x\nname: y\n")
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert "appears twice" in str(exc.value)


def test_unknown_profile_did_you_mean(spec_factory):
    spec = spec_factory({"site": {"profile": "local-tset"}})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert "Did you mean 'local-test'?" in str(exc.value)


def test_list_file_errors(spec_factory, tmp_path):
    (tmp_path / "list.txt").write_text("/a/x.raw 1GB 10\nrelative.raw\n/a/y.raw 3XB\n/a/z.raw 1GB ten\n")
    spec = spec_factory({"inputs": {"glob": None, "list_file": "list.txt"}})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    lines = sorted(p.line for p in exc.value.problems if p.file.endswith("list.txt"))
    assert lines == [2, 3, 4]


def test_input_size_unknown(spec_factory):
    spec = spec_factory({"inputs": {"glob": None, "files": ["/nonexistent/a.raw"]}})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert "size of '/nonexistent/a.raw' is unknown" in str(exc.value)


def test_duplicate_stems(spec_factory):
    spec = spec_factory({"inputs": {"glob": None, "size": "1GB",
                                    "files": ["/a/run1.raw", "/b/run1.raw"]}})
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    assert "same stem" in str(exc.value)


def test_cli_error_exit_2_no_traceback_no_output(cli, spec_factory, tmp_path):
    spec = spec_factory({"walltiem": 1})
    out = tmp_path / "plan-out"
    result = cli("plan", str(spec), "--out", str(out))
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "walltiem" in result.output and "line" in result.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if "hpcrun-tmp" in p.name]


def test_every_shipped_profile_validates(cli):
    result = cli("profiles", "validate")
    assert result.exit_code == 0, result.output
    for name in ("nersc-cori-haswell", "nersc-cori-knl", "nersc-perlmutter", "generic-apptainer",
                 "local-test"):
        assert name in result.output


def test_profile_errors(tmp_path, monkeypatch, cli):
    prof = tmp_path / "p"
    prof.mkdir()
    (prof / "a.yaml").write_text("name: a\nextends: b\n")
    (prof / "b.yaml").write_text("name: b\nextends: a\n")
    (prof / "c.yaml").write_text(yaml.safe_dump({
        "name": "c", "partitions": {"x": {"nodes": 1, "cores_per_node": 4, "memory_per_node": "1GB",
                                          "max_walltime": "1h"}},
        "default_partition": "y", "burst_buffer": {"system": "datawarp"}}))
    (prof / "d.yaml").write_text("name: d\nextends: nonexistent-parent\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    result = cli("profiles", "validate", "a", "c", "d")
    assert result.exit_code == 2
    assert "cycle" in result.output
    assert "needs at least one pool" in result.output
    assert "default_partition 'y'" in result.output
    assert "no site profile named 'nonexistent-parent'" in result.output
