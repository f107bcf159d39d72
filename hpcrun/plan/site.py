"""Where the campaign runs: its partition, QOS, time and node limits, container runtime."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan import checks as carried
from hpcrun.plan.checks import Checks
from hpcrun.units import format_duration


@dataclass(frozen=True)
class SiteChoice:
    name: str                      # the partition's name
    partition: Partition
    qos: Optional[str]


def choose_site(campaign: Campaign, profile: SiteProfile, checks: Checks) -> SiteChoice:
    """The partition and QOS, checked against the profile's limits; stops on an unknown one."""
    pname = campaign.site.partition or profile.default_partition
    partition = profile.partitions.get(pname)
    if partition is None:
        checks.spec_error(("site", "partition"), (
            f"partition '{pname}' is not in site profile '{profile.name}'; valid: "
            + ", ".join(sorted(profile.partitions)) + "."))
        checks.raise_if_any()
    assert partition is not None
    qos = campaign.site.qos or partition.default_qos
    if campaign.site.qos and partition.qos and campaign.site.qos not in partition.qos:
        checks.spec_error(("site", "qos"), (
            f"QOS '{campaign.site.qos}' is not allowed on partition '{pname}'; valid: "
            + ", ".join(partition.qos) + "."))
    if campaign.walltime > partition.max_walltime:
        checks.spec_error(("walltime",), (
            f"walltime {format_duration(campaign.walltime)} exceeds the maximum "
            f"{format_duration(partition.max_walltime)} of partition '{pname}' "
            f"(profile '{profile.name}')."))
    max_nodes = min(partition.nodes, partition.max_nodes_per_job or partition.nodes)
    if campaign.jobs.nodes > max_nodes:
        checks.spec_error(("jobs", "nodes"), (
            f"{campaign.jobs.nodes} nodes per job, but partition '{pname}' allows at most "
            f"{max_nodes}."))
    carried.check_directive_values(campaign, profile, pname, checks.spec_error, checks.profile_error)
    _check_runtime_offered(campaign, profile, checks)
    return SiteChoice(pname, partition, qos)


def _check_runtime_offered(campaign: Campaign, profile: SiteProfile, checks: Checks) -> None:
    offered = profile.containers.offered()
    rt_name = campaign.container.runtime
    if rt_name not in offered:
        checks.spec_error(("container", "runtime"), (
            f"site profile '{profile.name}' does not offer container runtime '{rt_name}'; "
            f"it offers: {', '.join(offered)}."))
        checks.raise_if_any()
