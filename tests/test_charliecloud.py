"""Charliecloud as a runtime, without running it: what the plan refuses (with file, line and key),
which binds it emits and in what order, the mount-point checks against an image directory, and
the golden render + shellcheck of the detector-reco example inside Charliecloud.
The job really running inside ch-run: tests/test_job_charliecloud.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hpcrun.errors import InputError
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import render_plan, write_plan

from .conftest import REPO
from .test_render import _lint

GOLDEN = REPO / "tests" / "golden" / "detector-reco-charliecloud"
GOLDEN_FILES = ["jobs/job00001.sbatch", "bin/hpcrun-job.sh", "bin/hpcrun-db.sh", "bin/hpcrun-chain.sh"]


def _problems(spec: Path):
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    return exc.value.problems


def _one(problems, key: str, fragment: str):
    found = [p for p in problems if p.key == key and fragment in p.message]
    assert found, "\n".join(p.render() for p in problems)
    assert found[0].line is not None
    return found[0]


CC = {"runtime": "charliecloud", "image": "/nonexistent/images/reco"}


@pytest.mark.parametrize("container, key, fragment", [
    ({"runtime": "charliecloud", "image": "docker:hpcrun/reco:1"}, "container.image",
     "is a registry reference, but ch-run runs an unpacked image directory"),
    ({"runtime": "charliecloud", "image": "images/reco"}, "container.image", "not an absolute path"),
    ({"runtime": "charliecloud", "image": "/etc/hostname"}, "container.image",
     "is a file, but ch-run runs unpacked image directories"),
    ({**CC, "options": ["-w"]}, "container.options.0", "mounts the image read-write"),
    ({**CC, "options": ["--unset-env=SLURM_*"]}, "container.options.0", "removes SLURM_PROCID"),
    ({**CC, "options": ["--unset-env=*"]}, "container.options.0", "removes HPCRUN_RUNDIR"),
    ({**CC, "options": ["--volume=/x:/y:perNodeCache=size=1G"]}, "container.options.0",
     "a perNodeCache size only means something for Shifter; with 'charliecloud'"),
    ({**CC, "modules": ["mpich"]}, "container.modules",
     "modules are Shifter's --module option; container runtime 'charliecloud' has none"),
    ({"runtime": "apptainer", "image": "/x.sif", "modules": ["mpich"]}, "container.modules",
     "container runtime 'apptainer' has none"),
])
def test_what_charliecloud_refuses(spec_factory, container, key, fragment):
    _one(_problems(spec_factory({"container": container})), key, fragment)


def test_narrow_unset_env_is_fine(spec_factory):
    plan = load_plan(spec_factory({"container": {**CC, "options": ["--unset-env=LD_LIBRARY_PATH"]}}))
    assert "ch-run --unset-env=LD_LIBRARY_PATH -b " in plan.container.prefix
    assert any("not visible here" in n for n in plan.notes)


def _profile(tmp_path: Path, **charliecloud) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"name": "cc-site", "extends": "local-test",
                                    "containers": {"charliecloud": {"command": "ch-run", **charliecloud}}}))
    return str(path)


def test_burst_buffer_needs_a_root(spec_factory, tmp_path):
    # local-test sets burst_buffer_root and a child profile cannot unset it: copy it without
    base = yaml.safe_load((REPO / "site-profiles" / "local-test.yaml").read_text())
    base["name"] = "cc-nobb"
    base["containers"]["charliecloud"] = {"command": "ch-run"}
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump(base))
    spec = spec_factory({"site": {"profile": str(profile)}, "container": CC,
                         "burst_buffer": {"capacity": "1GiB"}})
    found = _one(_problems(spec), "containers.charliecloud", "set containers.charliecloud.burst_buffer_root")
    assert found.file == str(profile)


def _image(tmp_path: Path, *mount_points: str) -> Path:
    image = tmp_path / "image"
    for mp in ("etc", "tmp", "home", *mount_points):
        (image / mp.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return image


def test_missing_mount_point_is_named_with_its_fix(spec_factory, tmp_path):
    image = _image(tmp_path)
    spec = spec_factory({"container": {"runtime": "charliecloud", "image": str(image)},
                         "outputs": {"location": "/srv/hpcrun-cc-test/out"}})
    found = _one(_problems(spec), "outputs.location", "has no mount point /srv/hpcrun-cc-test/out")
    assert found.message == (
        f"the Charliecloud image {image} has no mount point /srv/hpcrun-cc-test/out for binding "
        "/srv/hpcrun-cc-test/out: ch-run mounts images read-only and cannot create it. Create it "
        f"when building the image (mkdir -p {image}/srv/hpcrun-cc-test/out), or add a site bind "
        "in containers.charliecloud.binds that contains it.")
    (image / "srv/hpcrun-cc-test/out").mkdir(parents=True)
    plan = load_plan(spec)
    assert "-b /srv/hpcrun-cc-test/out:/srv/hpcrun-cc-test/out" in plan.container.prefix


def test_site_binds_stand_in_for_paths_under_them(spec_factory, tmp_path):
    image = _image(tmp_path, "/srv/site")
    spec = spec_factory({"site": {"profile": _profile(tmp_path, binds=["/srv/site", "/opt/sw:/sw"],
                                                      private_tmp=True, home="/home")},
                         "container": {"runtime": "charliecloud", "image": str(image)},
                         "outputs": {"location": "/srv/site/out"}})
    problems = _problems(spec)      # /sw is not in the image
    _one(problems, "containers.charliecloud.binds.1", "has no mount point /sw")
    (image / "sw").mkdir()
    plan = load_plan(spec)
    prefix = plan.container.prefix
    data = str(tmp_path / "data")
    assert prefix == (
        f"ch-run --private-tmp -b /srv/site:/srv/site -b /opt/sw:/sw -b {data}:{data} "
        '-b "${HPCRUN_PLAN_DIR}":"${HPCRUN_PLAN_DIR}" --set-env=HOME=/home ' + f"{image} --")
    assert "/srv/site/out" not in prefix      # inside the site bind
    # without private_tmp the host's /tmp is bound at /tmp (ch-run would mount $TMPDIR there),
    # and covers every path under it
    plan = load_plan(spec_factory({
        "site": {"profile": _profile(tmp_path, binds=["/srv/site", "/opt/sw:/sw"], home="/home")},
        "container": {"runtime": "charliecloud", "image": str(image)},
        "outputs": {"location": "/srv/site/out"}}))
    assert plan.container.prefix == (
        "ch-run -b /tmp:/tmp -b /srv/site:/srv/site -b /opt/sw:/sw "
        '-b "${HPCRUN_PLAN_DIR}":"${HPCRUN_PLAN_DIR}" --set-env=HOME=/home ' + f"{image} --")


def test_home_must_exist_in_the_image(spec_factory, tmp_path):
    image = _image(tmp_path)
    spec = spec_factory({"site": {"profile": _profile(tmp_path, home="/users/x")},
                         "container": {"runtime": "charliecloud", "image": str(image)}})
    _one(_problems(spec), "containers.charliecloud.home", "HOME /users/x does not exist in the Charliecloud image")


def test_site_bind_syntax(spec_factory, tmp_path):
    spec = spec_factory({"site": {"profile": _profile(tmp_path, binds=["relative:/x"])}})
    _one(_problems(spec), "containers.charliecloud.binds", "is not SRC or SRC:DST with absolute paths")


def test_golden_and_shellcheck(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    rel = GOLDEN.relative_to(REPO) / "campaign.yaml"
    plan = load_plan(rel)
    files, _ = render_plan(plan, Path("/plans") / "detector-reco-charliecloud")
    rendered = {f.path: f.text for f in files}
    update = os.environ.get("HPCRUN_UPDATE_GOLDEN") == "1"
    for name in GOLDEN_FILES:
        golden = GOLDEN / name
        if update:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(rendered[name])
        assert rendered[name] == golden.read_text(), f"{name} differs from its golden file"
    result = write_plan(plan, tmp_path / "plan")
    _lint(result.out_dir, plan.profile.burst_buffer.directive)
    script = rendered["bin/hpcrun-job.sh"]   # the steps; the job script is the directive header
    prefix = ('ch-run -b /tmp:/tmp -b "${HPCRUN_PLAN_DIR}":"${HPCRUN_PLAN_DIR}" '
              '--set-env=HOME="$HPCRUN_RUNDIR" /tmp/hpcrun-test-cluster/images/reco -- ')
    assert script.count(prefix) == 5       # DB supervisor, chains, merge, 2 x QA event count
