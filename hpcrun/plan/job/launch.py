"""How a job starts its processes: in its batch step, or as steps of the scheduler's task launcher.

Every launcher step costs the controller RPCs from the job's user (issue 46: on Slurm 2 per step, plus one
from the node's step daemon as it ends), so a one-node job starts its database server and chains as processes of the
batch step unless the site profile or the spec asks for steps. Jobs of several nodes need the launcher to
reach their other nodes.
"""

from __future__ import annotations

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.values import LaunchPlan


def launch_plan(campaign: Campaign, profile: SiteProfile, database: bool) -> LaunchPlan:
    """The launch every job of the campaign uses, with why and its scheduler cost."""
    why = _step_reason(campaign, profile)
    if not why:
        return LaunchPlan(True, "one node per job: the batch step starts them (launcher.single_node: batch)",
                          0, 0, 0)
    launch = scheduler_for(profile.scheduler.kind).launch
    steps = 1 + int(database)
    return LaunchPlan(False, why, steps, steps * launch.step_rpcs, steps * launch.step_end_rpcs)


def _step_reason(campaign: Campaign, profile: SiteProfile) -> str:
    """Why the jobs need launcher steps, or '' when the batch step can start everything."""
    if campaign.jobs.nodes > 1:
        return f"{campaign.jobs.nodes} nodes per job: only the launcher reaches the other nodes"
    if campaign.chain.launch == "step":
        return "the spec asks for launcher steps (chain.launch: step)"
    if profile.launcher.single_node == "step":
        return f"site profile '{profile.name}' asks for launcher steps (launcher.single_node: step)"
    return ""
