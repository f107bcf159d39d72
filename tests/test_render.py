"""Rendered scripts: directive placement and grammar, bash -n and shellcheck for every
shipped example against every shipped profile it validates on."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from hpcrun.backends.burstbuffer.grammar import check_line, check_script
from hpcrun.errors import InputError
from hpcrun.model.profiles import available
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO, shellcheck_cmd

EXAMPLES = sorted(p for p in (REPO / "examples").glob("*/campaign.yaml"))
PROFILES = sorted(available())


CLUSTER_ROOT = "/tmp/hpcrun-test-cluster/pfs"


def _materialize(example: Path, tmp_path: Path) -> dict:
    """Example data as a dict; examples for the test cluster get stand-in inputs and payload."""
    text = example.read_text()
    if CLUSTER_ROOT in text:
        root = tmp_path / "pfs"
        text = text.replace(CLUSTER_ROOT, str(root))
        data = yaml.safe_load(text)
        raw = Path(data["inputs"]["glob"]).parent
        raw.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            (raw / f"run{i}.h5").write_bytes(b"0" * 4096)
        Path(data["database"]["payload"]).mkdir(parents=True, exist_ok=True)
        return data
    return yaml.safe_load(text)


def _own(example: Path, tmp_path: Path) -> Path:
    out = tmp_path / "own.yaml"
    data = _materialize(example, tmp_path)
    refs = data["site"]["profile"]
    if isinstance(refs, list):   # several clusters' profiles beside the example's spec
        def absolute(ref: str) -> str:
            return str(example.parent / ref) if ref.endswith(".yaml") else ref
        data["site"]["profile"] = [absolute(r) if isinstance(r, str) else dict(r, profile=absolute(r["profile"]))
                                   for r in refs]
    for key in ("list_file", "checksum_catalog"):
        if data.get("inputs", {}).get(key):
            data["inputs"][key] = str(example.parent / data["inputs"][key])
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _variant(example: Path, profile: str, tmp_path: Path) -> Path:
    """The example retargeted at another profile (partition/QOS reset to that site's defaults)."""
    data = _materialize(example, tmp_path)
    data["site"] = {"profile": profile}
    for key in ("list_file", "checksum_catalog"):
        if data.get("inputs", {}).get(key):
            data["inputs"][key] = str(example.parent / data["inputs"][key])
    out = tmp_path / f"{example.parent.name}-{profile}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _lint(plan_dir: Path, directive: str) -> None:
    files = sorted((plan_dir / "jobs").glob("*.sbatch")) + sorted((plan_dir / "bin").glob("*.sh"))
    assert files
    for f in files:
        subprocess.run(["bash", "-n", str(f)], check=True)
    for start in range(0, len(files), 50):
        batch = [str(f) for f in files[start:start + 50]]
        proc = subprocess.run(shellcheck_cmd() + ["-s", "bash", "-S", "style"] + batch,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
    for f in sorted((plan_dir / "jobs").glob("*.sbatch")):
        lines = f.read_text().splitlines()
        assert lines[0] == "#!/bin/bash"
        assert check_script(lines, "#" + directive, job_directive="#SBATCH") == []
        first_cmd = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("#SBATCH", "#DW", "#BB")):
                assert i < first_cmd and not line.startswith(" "), f"{f}:{i + 1}: {line}"
            if line.startswith(("#DW", "#BB")):
                assert check_line(line, "#" + directive) is None, line


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_examples_plan_on_their_own_profile(example, tmp_path, monkeypatch):
    from hpcrun.backends.scheduler.slurm import Slurm
    monkeypatch.setattr(Slurm, "known_clusters", lambda self: None)   # as on a laptop, whatever runs here
    plan = load_plan(_own(example, tmp_path))
    result = write_plan(plan, tmp_path / "plan")
    _lint(result.out_dir, plan.profile.burst_buffer.directive)
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["totals"]["jobs"] == len(plan.jobs) > 0


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("example", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_every_example_on_every_profile(example, profile, tmp_path):
    spec = _variant(example, profile, tmp_path)
    try:
        plan = load_plan(spec)
    except InputError as exc:
        # An incompatible pair must fail cleanly, with a located message.
        assert exc.problems and all(p.message for p in exc.problems)
        pytest.skip(f"{example.parent.name} does not fit {profile}: {exc.problems[0].message[:80]}")
    result = write_plan(plan, tmp_path / "plan")
    _lint(result.out_dir, plan.profile.burst_buffer.directive)


def test_star_cori_directives(tmp_path):
    plan = load_plan(REPO / "examples/star-cori/campaign.yaml")
    out = write_plan(plan, tmp_path / "p").out_dir
    text = (out / "jobs" / f"{plan.scripts[0].name}.sbatch").read_text()
    assert "#SBATCH --image=docker:mmustafa/sl64_sl16d:v1_pdsf6" in text
    vols = [line for line in text.splitlines() if line.startswith("#SBATCH --volume")]
    assert vols == ["#SBATCH --volume=/global/cscratch1/sd:/dbcache:perNodeCache=size=36G"]
    jobdw = [line for line in text.splitlines() if line.startswith("#DW jobdw")]
    assert jobdw == ["#DW jobdw capacity=20GB access_mode=striped type=scratch"]
    assert re.search(r"^#DW stage_in source=/global/cscratch1/\S+\.daq destination=\$DW_JOB_STRIPED/in/\S+ "
                     r"type=file$", text, re.M)
    assert "#DW stage_out source=$DW_JOB_STRIPED/out destination=/global/cscratch1/sd/starprod/reco/2019 " \
           "type=directory" in text
    body = (out / "bin" / "hpcrun-job.sh").read_text()
    # one node per job: the batch step starts the servers and chains, no srun step (issue 46)
    assert "launch_in_batch 1 \\\n  shifter bash" in body and "srun" not in body
    # the job script is the directive header: it runs the shared body by its absolute path
    assert text.splitlines()[-2:] == ["export HPCRUN_JOB_INDEX=0", f"exec bash {out}/bin/hpcrun-job.sh"]
    assert "srun" not in text.split("#\n# hpcrun", 1)[1] and not body.count("#SBATCH")
    assert len(plan.scripts) == 40 and all(s.array is None for s in plan.scripts)
    assert any("rounded up to the 20GB granularity" in n for n in plan.notes)


def test_arrays_chunked_by_max_array_size(spec_factory, tmp_path, monkeypatch):
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "small-arrays.yaml").write_text("name: small-arrays\nextends: local-test\nmax_array_size: 4\n"
                                             "array_throttle: 2\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    spec = spec_factory({"site": {"profile": "small-arrays"}}, inputs=10)
    plan = load_plan(spec)
    assert [s.array for s in plan.scripts] == ["0-3%2", "0-3%2", "0-1%2"]
    out = write_plan(plan, tmp_path / "p").out_dir
    text = (out / "jobs/array002.sbatch").read_text()
    assert "HPCRUN_JOB_INDEX=$(( 4 + HPCRUN_ARRAY_INDEX ))" in text
    assert "export HPCRUN_ARRAY_INDEX=${SLURM_ARRAY_TASK_ID:?" in text
    rows = (out / "tasks.tsv").read_text().splitlines()
    assert len(rows) == 10 and rows[4].startswith("4\ttest-campaign.00005\t2\t")


def test_slurm_lua_always_writes_pool(spec_factory):
    plan = load_plan(spec_factory({"burst_buffer": {"capacity": "10GB", "stage_inputs": False}}))
    assert plan.scripts[0].bb_lines[0] == \
        "#DW jobdw capacity=10GiB access_mode=striped type=scratch pool=wlm_pool"


def test_site_template_override_is_searched_first(spec_factory, tmp_path, monkeypatch):
    prof = tmp_path / "site"
    (prof / "templates").mkdir(parents=True)
    (prof / "mysite.yaml").write_text("name: mysite\nextends: local-test\ntemplate: mysite\n")
    (prof / "templates" / "mysite.sh.j2").write_text(
        '{% extends "slurm.sh.j2" %}\n{% block prologue %}\n# site prologue: load our tools\n'
        'export SITE_TOOLS=1\n{% endblock %}\n')
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    plan = load_plan(spec_factory({"site": {"profile": "mysite"}}))
    out = write_plan(plan, tmp_path / "p").out_dir
    text = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "# site prologue: load our tools" in text
    _lint(out, "DW")


def test_template_typo_is_an_error_not_blank(spec_factory, tmp_path, monkeypatch):
    prof = tmp_path / "site"
    (prof / "templates").mkdir(parents=True)
    (prof / "typo.yaml").write_text("name: typo\nextends: local-test\ntemplate: typo\n")
    (prof / "templates" / "typo.sh.j2").write_text(
        '{% extends "slurm.sh.j2" %}\n{% block prologue %}echo {{ campaing }}\n{% endblock %}\n')
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))
    plan = load_plan(spec_factory({"site": {"profile": "typo"}}))
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        write_plan(plan, tmp_path / "p")
    assert not (tmp_path / "p").exists()


def _site(tmp_path, monkeypatch, name, text):
    prof = tmp_path / "site"
    prof.mkdir(exist_ok=True)
    (prof / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))


def test_rabbit_directives(spec_factory, tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, "rabbit-site",
          "name: rabbit-site\nextends: local-test\nburst_buffer:\n  system: rabbit\n  directive: DW\n")
    plan = load_plan(spec_factory({"site": {"profile": "rabbit-site"},
                                   "burst_buffer": {"capacity": "10GB", "stage_inputs": False}}))
    out = write_plan(plan, tmp_path / "p").out_dir
    text = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "#DW jobdw type=xfs capacity=10GiB name=hpcrun" in text
    assert "#DW copy_out source=$DW_JOB_hpcrun/out destination=" in text
    assert 'HPCRUN_OUTDIR="${DW_JOB_hpcrun%/}"/out' in text


def test_rabbit_buffer_of_a_late_bound_pilot(spec_factory, tmp_path, monkeypatch):
    """Late binding on Rabbit: the pilot's one jobdw for its slots, the claims in their share of $DW_JOB_hpcrun."""
    _site(tmp_path, monkeypatch, "rabbit-site",
          "name: rabbit-site\nextends: local-test\nburst_buffer:\n  system: rabbit\n  directive: DW\n")
    plan = load_plan(spec_factory({"site": {"profile": "rabbit-site"}, "jobs": {"binding": "late",
                                                                               "pilot": {"slots": 2}},
                                   "burst_buffer": {"capacity": "10GB"}}))
    out = write_plan(plan, tmp_path / "p").out_dir
    pilot = (out / "bin" / "hpcrun-pilot.sh").read_text()
    assert "#DW jobdw type=xfs capacity=20GiB name=hpcrun" in pilot
    assert 'BB="${DW_JOB_hpcrun%/}"' in pilot and "copy_in" not in pilot
    text = next((out / "jobs").glob("*.sbatch")).read_text()
    assert not [line for line in text.splitlines() if line.startswith("#DW")]
    assert 'HPCRUN_INPUT_DIR="${DW_JOB_hpcrun%/}"/claims/"${HPCRUN_JOB_ID}"/in' in text


def test_no_arrays_site_falls_back_to_job_scripts(spec_factory, tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, "noarrays", "name: noarrays\nextends: local-test\nmax_array_size: 0\n")
    plan = load_plan(spec_factory({"site": {"profile": "noarrays"}}, inputs=3))
    assert [s.array for s in plan.scripts] == [None, None, None]


def test_missing_site_template_is_a_profile_error(spec_factory, tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, "notemplate", "name: notemplate\nextends: local-test\ntemplate: nope\n")
    with pytest.raises(InputError) as exc:
        load_plan(spec_factory({"site": {"profile": "notemplate"}}))
    [p] = exc.value.problems
    assert p.key == "template" and p.line == 3 and "nope.sh.j2' was not found" in p.message


def test_podman_passes_spec_variables_and_chain_env(spec_factory, tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, "podsite",
          "name: podsite\nextends: local-test\ncontainers:\n  podman-hpc: {command: podman-hpc}\n")
    plan = load_plan(spec_factory({"site": {"profile": "podsite"},
                                   "container": {"runtime": "podman-hpc", "image": "img:1"},
                                   "software": {"env": {"TRAIN_CONFIG": "/c.yaml"}},
                                   "chain": {"env": {"OMP_NUM_THREADS": "1"}}}))
    out = write_plan(plan, tmp_path / "p").out_dir
    job = next((out / "jobs").glob("*.sbatch")).read_text()
    assert "-e 'HPCRUN_*' -e 'SLURM_*' -e 'DW_*' -e OMP_NUM_THREADS -e TRAIN_CONFIG" in job
    assert "export OMP_NUM_THREADS=1" in (out / "bin/hpcrun-chain.sh").read_text()


def test_replan_keeps_logs_and_run_records(spec_factory, tmp_path):
    out = tmp_path / "p"
    write_plan(load_plan(spec_factory()), out)
    (out / "logs" / "old.out").write_text("log")
    (out / "run" / "job" / "1").mkdir(parents=True)
    write_plan(load_plan(spec_factory({"walltime": "00:20:00"})), out)
    assert (out / "logs" / "old.out").read_text() == "log"
    assert (out / "run" / "job" / "1").is_dir()


def test_directive_check_of_a_rendered_script():
    """Placement, column 0, grammar and one jobdw: what the check after every render finds."""
    from hpcrun.backends.burstbuffer.grammar import check_script
    good = ["#!/bin/bash", "#SBATCH --nodes=1", "#DW jobdw capacity=10GB access_mode=striped type=scratch",
            "#", "# a comment with #DW in it", "export HPCRUN_JOB_INDEX=0", "exec bash /p/bin/hpcrun-job.sh"]
    assert check_script(good, "#DW", job_directive="#SBATCH") == []
    late = good + ["#DW stage_out source=$DW_JOB_STRIPED/out destination=/o type=directory"]
    assert check_script(late, "#DW", job_directive="#SBATCH") == [
        "line 8: directive after the first command is ignored by the scheduler"]
    indented = good[:2] + ["  #SBATCH --time=1:00"] + good[2:]
    # sbatch stops reading directives at the first line that does not start with '#'
    assert check_script(indented, "#DW", job_directive="#SBATCH") == [
        "line 3: directive after the first command is ignored by the scheduler",
        "line 4: directive after the first command is ignored by the scheduler"]
    twice = good[:3] + good[2:]
    assert check_script(twice, "#DW", job_directive="#SBATCH") == ["more than one jobdw line"]
    bad = good[:2] + ["#DW jobdw capacity=3.5TB access_mode=striped type=scratch"] + good[3:]
    assert "capacity '3.5TB' must be an integer" in check_script(bad, "#DW", job_directive="#SBATCH")[0]


@pytest.mark.parametrize("chain", [["reco", "{input}", "{output}"], ["reco", "{input}", "{output}", "{workdir}"]],
                         ids=["unused", "named"])
def test_an_array_job_makes_its_work_directory_only_where_something_uses_it(spec_factory, tmp_path, chain):
    """Without a merge's parts, staged inputs, a container or a command naming {workdir}, a job makes no work
    directory (and removes none); the example's merge, or a chain naming it, keeps it (issue 55)."""
    spec = spec_factory({"jobs": {"chains_per_node": 1}, "chain": {"command": chain}, "merge": None})
    text = (write_plan(load_plan(spec), tmp_path / "p").out_dir / "jobs/array001.sbatch").read_text()
    named = "{workdir}" in chain
    assert ('mkdir -p "$HPCRUN_WORKDIR" "$HPCRUN_OUTDIR"' in text) is named
    assert 'mkdir -p "$HPCRUN_OUTDIR" "$HPCRUN_RUNDIR/chains"' in text or named   # the rest still made
    assert ('rmdir -- "$HPCRUN_WORKDIR"' in text) is named
    merged = (write_plan(load_plan(spec_factory()), tmp_path / "q").out_dir / "jobs/array001.sbatch").read_text()
    assert 'mkdir -p "$HPCRUN_WORKDIR" "$HPCRUN_OUTDIR"' in merged and 'remove_tree "$HPCRUN_WORKDIR"' in merged


PLAIN = {"jobs": {"chains_per_node": 1}, "chain": {"command": ["reco", "{input}", "{output}"]}, "merge": None}


@pytest.mark.parametrize("change, made", [
    ({}, False),
    ({"merge": {"command": ["merge", "{output}", "{parts}"]}, "jobs": {"chains_per_node": 2}}, True),
    ({"chain": {"command": ["reco", "{input}", "{output}", "--tmp", "{workdir}"]}}, True),
    ({"qa": {"command": ["check", "{output}", "{workdir}"]}}, True),
    ({"chain": {"env": {"SCRATCH": "$HPCRUN_WORKDIR/tmp"}}}, True),
    ({"software": {"env": {"TMPDIR": "${HPCRUN_WORKDIR}"}}}, True),
    ({"outputs": {"workdir": "/tmp/hpcrun-work-of-my-own"}}, True),
    ({"burst_buffer": {"capacity": "10GB", "stage_inputs": False}}, True),
    ({"jobs": {"binding": "late"}}, False),
    ({"jobs": {"binding": "late"}, "chain": {"command": ["reco", "{input}", "{output}", "{workdir}"]}}, True),
], ids=["nothing", "merge", "chain", "qa", "chain-env", "software-env", "workdir-set", "burst-buffer", "late",
        "late-named"])
def test_what_makes_a_job_make_its_work_directory(spec_factory, change, made):
    """The renderer's decision (render/scripts.py, _work_dir_made): anything that may read or write the work
    directory keeps it made; a plan where nothing does makes none (issue 55)."""
    from hpcrun.render.scripts import _work_dir_made
    data = {k: v for k, v in PLAIN.items()}
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) and isinstance(value, dict) else value
    assert _work_dir_made(load_plan(spec_factory(data))) is made


def test_a_site_copy_of_any_template_keeps_the_work_directory(spec_factory, tmp_path, monkeypatch):
    """A site's own copy of one of hpcrun's templates (here the chain's) may use the work directory: it is made."""
    from hpcrun.render.scripts import _work_dir_made
    assert _work_dir_made(load_plan(spec_factory(PLAIN))) is False
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    (site / "templates" / "hpcrun-db.sh.j2").write_text((REPO / "templates" / "hpcrun-db.sh.j2").read_text())
    (site / "mysite.yaml").write_text("name: mysite\nextends: local-test\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(site))
    assert _work_dir_made(load_plan(spec_factory({**PLAIN, "site": {"profile": "mysite"}}))) is True
