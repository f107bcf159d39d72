"""Gather a campaign report for a plan directory: the store's rows, named by the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple, Union

from hpcrun.errors import InputError, Problem
from hpcrun.operate.plandir import open_plan_store, read_manifest
from hpcrun.operate.track import finalize_summary
from hpcrun.operate.track import poll as status_poll
from hpcrun.report.figures import CampaignReport, build
from hpcrun.store.base import StateStoreError


def campaign_report(plan_dir: Union[str, Path], *, db: Optional[str] = None,
                    poll: bool = False) -> Tuple[CampaignReport, str]:
    """The report and the store location; ``poll`` records a fresh Slurm poll first."""
    plan_dir = Path(plan_dir).resolve()
    manifest = read_manifest(plan_dir)
    if db is None and not (plan_dir / "state.db").exists():
        raise InputError([Problem(str(plan_dir), None, "", (
            "has no campaign state yet (no state.db): submit it first with `hpcrun submit`"))])
    if poll:
        status_poll(plan_dir, db=db)
    with open_plan_store(plan_dir, db) as store:
        try:
            campaign = store.get_campaign(manifest["campaign"])
        except StateStoreError:
            raise InputError([Problem(store.location, None, "", (
                f"has no campaign '{manifest['campaign']}': submit the plan first with `hpcrun submit`"))]) from None
        data = store.report_rows(campaign.id)
        names = {j["index"]: j["name"] for j in manifest["jobs"]}
        report = build(campaign.name, data, names)
        report.finalize = finalize_summary(manifest, store, campaign.id)
        return report, store.location
