"""Where outputs are sent once they passed QA (``outputs.export``), checked at plan time.

The supervisor copies them (hpcrun/operate/outputs/exports.py); here the destination is checked once,
so that a typo or a server that is down stops the plan, not the first export hours later.
"""

from __future__ import annotations

import shlex
from typing import Optional

from hpcrun.backends.storage import StorageError, scheme_of, storage_for
from hpcrun.model.retry import effective_rules
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake.remote import plan_client
from hpcrun.plan.job.reads import client_env
from hpcrun.plan.values import ExportPlan

KEY = ("outputs", "export")


def export_plan(campaign: Campaign, profile: SiteProfile, checks: Checks) -> Optional[ExportPlan]:
    to = campaign.outputs.export
    if to is None:
        return None
    scheme = scheme_of(to)
    if scheme is None and not to.startswith("/"):
        checks.spec_error(KEY, f"'{to}' is neither root://HOST[:PORT]//PATH nor an absolute directory")
        return None
    if scheme is None and to.rstrip("/") == campaign.outputs.location.rstrip("/"):
        checks.spec_error(KEY, f"'{to}' is outputs.location itself; export to another place or leave it out")
        return None
    if scheme is not None and not _reachable(to, scheme, profile, checks):
        return None
    x, e = profile.xrootd, profile.exports
    rule = effective_rules(campaign.retry)["export"]
    return ExportPlan(
        to=to.rstrip("/") or "/", streams=e.streams, max_attempts=int(rule["max_attempts"]) if rule["retry"] else 1,
        backoff_s=float(e.backoff), max_backoff_s=float(e.max_backoff), timeout_s=float(e.timeout),
        copy=tuple(shlex.split(x.xrdcp)) if scheme else (), ask=tuple(shlex.split(x.xrdfs)) if scheme else (),
        client_env=client_env(profile) if scheme else ())


def _reachable(to: str, scheme: str, profile: SiteProfile, checks: Checks) -> bool:
    """The URL's syntax, and an answer from its server (a missing directory is fine: it is created)."""
    storage = storage_for(scheme)
    if scheme != "root" or storage is None:
        checks.spec_error(KEY, f"'{to}': outputs can be exported to root://HOST[:PORT]//PATH or to a directory")
        return False
    problem = storage.syntax_error(to)
    if problem:
        checks.spec_error(KEY, problem.replace("hpcrun can read", "hpcrun can write to"))
        return False
    try:
        storage.describe([to], None, plan_client(profile))
    except StorageError as exc:
        said = str(exc).split(" Sizes in the list file")[0].rstrip(" ;,")
        checks.spec_error(KEY, f"cannot export to '{to}': {said}; outputs would pile up unsent. Start the "
                          "server or correct the URL (hpcrun asks it at plan time)")
        return False
    return True
