"""Sarus, the container runtime added as one module plus its registry line and settings table:
planned from a spec, its job run under stand-ins (every bind source must exist, the chain
must run inside), and a bind path Sarus's --mount cannot carry refused with file and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpcrun.backends import container
from hpcrun.errors import InputError
from hpcrun.model.kinds import RUNTIMES
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO
from .test_hostile_fields import _normalize, _profile_data, _run, _stubs

EXAMPLE = REPO / "examples" / "detector-reco-local" / "campaign.yaml"


def _setup(root: Path, payload: str = "") -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    _normalize(spec, root)
    spec["container"] = {"runtime": "sarus", "image": "reco/star:1"}
    if payload:
        Path(payload).mkdir()
        spec["database"]["payload"] = payload
    profile = _profile_data("local-test", root)
    profile.setdefault("containers", {})["sarus"] = {"run_options": ["--tty=false"]}
    (root / "site").mkdir()
    (root / "site" / "sarus.yaml").write_text(yaml.safe_dump(profile))
    spec["site"]["profile"] = str(root / "site" / "sarus.yaml")
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_sarus_is_registered_and_offered_by_the_models():
    assert "sarus" in container.names()
    assert "sarus" in RUNTIMES


def test_sarus_job_runs_its_chains_inside_sarus(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    plan = load_plan(_setup(root))
    assert plan.container.runtime == "sarus"
    assert plan.container.prefix.startswith("sarus run --tty=false --mount=type=bind,source=")
    assert plan.container.prefix.endswith(" reco/star:1")
    plan_dir = write_plan(plan, root / "plan").out_dir
    calls = _run(plan_dir, root, _stubs(root))
    progs = [c["prog"] for c in calls]
    assert "sarus" in progs, progs
    chain_calls = [c for c in calls if c["prog"] == "stub-chain"]
    assert len(chain_calls) == 2, json.dumps(calls)[:2000]   # chains_per_node: 2, one job run
    assert any(c["prog"] == "stub-merge" for c in calls), progs


def test_a_comma_in_a_bind_path_is_refused(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    with pytest.raises(InputError) as info:
        load_plan(_setup(root, payload=str(root / "pay,load")))
    problem = info.value.problems[0]
    assert problem.key == "database.payload" and "comma" in problem.message, problem.render()
