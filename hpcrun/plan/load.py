"""The one-way flow: load -> validate -> plan (render and write live elsewhere)."""

from __future__ import annotations

from pathlib import Path

from hpcrun.errors import InputError, Problem
from hpcrun.model.profiles import load_profile
from hpcrun.model.spec import Campaign
from hpcrun.model.validate import build
from hpcrun.model.yamlsrc import load_yaml
from hpcrun.plan.build import Plan, plan


def load_plan(spec_path: Path) -> Plan:
    """Validate the spec and its profile together; all problems come in one InputError."""
    if not Path(spec_path).is_file():
        raise InputError([Problem(str(spec_path), None, "", "the campaign spec does not exist")])
    src = load_yaml(spec_path)
    problems = []
    try:
        campaign = build(Campaign, src)
    except InputError as exc:
        problems.extend(exc.problems)
        campaign = None
    # The profile is loaded even when the spec has errors, so both are reported at once.
    profile_name = (src.data.get("site") or {}).get("profile") if isinstance(src.data.get("site"), dict) else None
    loaded = None
    if isinstance(profile_name, str):
        file, line = src.where(("site", "profile"))
        try:
            loaded = load_profile(profile_name, (file, line, "site.profile"),
                                  relative_to=Path(spec_path).resolve().parent)
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    assert campaign is not None and loaded is not None
    return plan(campaign, src, loaded.profile, loaded.source, loaded.files)
