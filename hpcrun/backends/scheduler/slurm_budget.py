"""An account's allocation as Slurm keeps it: association limits and the usage they are compared with.

``sshare`` gives, per association of the cluster, ``GrpTRESMins`` (the group limit) and ``GrpTRESRaw``
(the usage that limit is compared with, in TRES-minutes, as the multifactor priority plugin keeps it);
``sacctmgr show assoc`` gives ``MaxTRESMins`` (the most one job may use). A job the group limit
holds pends with reason ``AssocGrpCPUMinutesLimit`` (``AssocGrpBillingMinutes`` ...).
"""

from __future__ import annotations

import getpass
import re
from typing import Callable, Dict, List, Optional, Tuple

from hpcrun.backends.scheduler.base import Allocation, SchedulerError

Run = Callable[[List[str]], str]    # a command's output (raises when it fails)

SHARE_FIELDS = "Cluster,Account,User,GrpTRESMins,GrpTRESRaw"
# a group limit on TRES-minutes, for the association or its QOS: spent until someone raises it
# (RunMinutes limits are not: they clear as running jobs end)
_BUDGET = re.compile(r"^(Assoc|QOS)Grp\w*?Min(ute)?s(Limit)?$")


def is_budget_reason(reason: str) -> bool:
    text = reason.strip("() ")
    return bool(_BUDGET.match(text)) and "RunMin" not in text


def tres_map(text: str) -> Dict[str, float]:
    """``cpu=120,billing=240,gres/gpu=4`` -> {"cpu": 120.0, ...}; values that are not numbers skipped."""
    out: Dict[str, float] = {}
    for part in text.strip().split(","):
        key, sep, value = part.partition("=")
        if sep:
            try:
                out[key.strip()] = float(value)
            except ValueError:
                continue
    return out


def default_account(run: Run, user: str) -> str:
    out = run(["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=defaultaccount"])
    account = next((line.strip() for line in out.splitlines() if line.strip()), "")
    if not account:
        raise SchedulerError(f"sacctmgr knows no default account of user {user}: give site.account")
    return account


def parse_share(text: str, user: str) -> Tuple[Optional[str], List[Tuple[str, str, int]],
                                              List[Tuple[str, str, float]]]:
    """``sshare -n -P -a -A ACCOUNT -o SHARE_FIELDS`` -> (cluster, limits, usage) of the account's own
    row and of this user's row under it."""
    cluster: Optional[str] = None
    limits: List[Tuple[str, str, int]] = []
    used: List[Tuple[str, str, float]] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        who = parts[2].strip()
        if who and who != user:
            continue
        scope = "user" if who else "account"
        cluster = cluster or parts[0].strip() or None
        limits += [(scope, tres, int(v)) for tres, v in tres_map(parts[3]).items() if v >= 0]
        used += [(scope, tres, v) for tres, v in tres_map(parts[4]).items()]
    return cluster, limits, used


def parse_per_job(text: str, user: str) -> List[Tuple[str, int]]:
    """``sacctmgr show assoc format=user,maxtresmins`` rows of the account and this user -> MaxTRESMins."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        who, _, value = line.partition("|")
        if who.strip() in ("", user):
            for tres, v in tres_map(value).items():
                out[tres] = min(out.get(tres, int(v)), int(v))
    return sorted(out.items())


def allocation(run: Run, account: Optional[str], cluster: Optional[str]) -> Allocation:
    """The account's limits and usage on ``cluster`` (None: the one the commands reach)."""
    user = getpass.getuser()
    account = account or default_account(run, user)
    share = run(["sshare", "--noheader", "--parsable2", "--all", f"--accounts={account}", "-o", SHARE_FIELDS])
    named, limits, used = parse_share(share, user)
    if not used:
        raise SchedulerError(f"sshare lists no association of account {account}"
                             + (f" on cluster {cluster}" if cluster else ""))
    where = [f"account={account}"] + ([f"cluster={named}"] if named else [])
    per_job = parse_per_job(run(["sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", *where,
                                 "format=user,maxtresmins"]), user)
    return Allocation(account, cluster or named, tuple(limits), tuple(used), tuple(per_job))
