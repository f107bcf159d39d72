"""Planner: campaign spec + site profile -> a frozen Plan (no text rendering here).

Every cross-check that needs both files lives in the steps below and reports all problems
at once, pointing at the spec key (and naming the profile value it conflicts with).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from hpcrun.backends.scheduler import scheduler_for
from hpcrun.errors import InputError
from hpcrun.model.site import Partition, SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.model.yamlsrc import Located
from hpcrun.plan import checks as carried
from hpcrun.plan.checks import Checks
from hpcrun.plan.footprint import quota_lines
from hpcrun.plan.intake.inputs import InputItem, expand
from hpcrun.plan.intake.locality import group_by_node
from hpcrun.plan.intake.remote import Remote
from hpcrun.plan.job.buffer import choose_buffer
from hpcrun.plan.job.checksums import assign as assign_checksums
from hpcrun.plan.job.checksums import assign_listed
from hpcrun.plan.job.commands import check_outputs, commands_of
from hpcrun.plan.job.container import check_runtime, container_plan
from hpcrun.plan.job.database import database_and_runtime
from hpcrun.plan.job.exports import export_plan
from hpcrun.plan.job.jobs import data_dirs, group_jobs, scripts_of
from hpcrun.plan.job.launch import launch_plan
from hpcrun.plan.job.listed import Listed, scan
from hpcrun.plan.job.pilots import late_dirs, pilot_plan, with_buffer
from hpcrun.plan.job.reads import remote_plan, stage_dir_expr
from hpcrun.plan.job.requests import finalize_request, launcher, with_request
from hpcrun.plan.site import choose_site
from hpcrun.plan.values import ChecksumPlan, Job, Plan, StreamedJobs, Succession, chains_of
from hpcrun.shell import quote


def plan(campaign: Campaign, spec_src: Located, profile: SiteProfile, profile_src: Located,
         profile_files: List[Path], succession: Succession = Succession()) -> Plan:
    """Check the spec against the site and decide everything the job scripts need (``succession``: for a
    later generation, which inputs it leaves out and where its job numbers start)."""
    checks = Checks(spec_src, profile_src)
    spec_dir = Path(spec_src.file).resolve().parent
    site = choose_site(campaign, profile, checks)
    remote = Remote(profile, campaign.inputs.checksum)  # URL inputs: each server asked once
    items: Sequence[InputItem]
    try:   # a large list file is scanned, not held (Listed); else read whole
        scanned = scan(campaign, spec_src, spec_dir)
        items = scanned if scanned is not None else expand(campaign.inputs, spec_src, spec_dir, remote)
    except InputError as exc:
        checks.problems.extend(exc.problems)
        items = []
    inputs_key = next(k for k in ("files", "glob", "list_file") if getattr(campaign.inputs, k))
    items = _left_to(succession, items, inputs_key, spec_src, checks)
    listed = isinstance(items, Listed)   # its paths are local, and were checked as they were read
    paths = () if listed else [i.path for i in items]
    if not listed:
        carried.check_table_values(items, inputs_key, checks.spec_error)
    sums = assign_listed(campaign.inputs, spec_src, spec_dir, items) if isinstance(items, Listed) else \
        assign_checksums(campaign.inputs, spec_src, spec_dir, paths, remote=remote)
    checks.problems.extend(sums.problems)
    _check_chains(campaign, site.partition.cpus, site.name, checks)
    notes: List[str] = list(sums.notes)
    # the built-in HDF5 steps run inside the container (its python3) or with the profile's Python
    helper_python = "python3" if campaign.container.runtime != "none" else profile.tools.python
    commands = commands_of(campaign, items, site, profile.name, checks, helper_python)
    outputs = check_outputs(campaign, items, checks)
    remote_reads = remote_plan(campaign, profile, paths, inputs_key, checks, notes)
    exports = export_plan(campaign, profile, checks)
    buffer = choose_buffer(campaign, profile, items, inputs_key, checks)
    db_plan, runtime = database_and_runtime(campaign, profile, checks)
    check_runtime(campaign, profile, runtime, db_plan, checks)
    checks.raise_if_any()

    if campaign.jobs.locality == "prefer" and remote_reads is not None and remote_reads.node_cache is not None:
        items, sums.values = group_by_node(items, sums.values, remote_reads.node_cache.index, notes)
        outputs = None   # in the new order: named again
    jobs = group_jobs(campaign, items, sums, site.partition.cpus, buffer, checks, notes, outputs,
                      first=succession.first_index)
    checks.raise_if_any()
    _idle_cores_note(campaign, site.name, site.partition, jobs, notes)
    input_dir, work_dir, out_dir, workdir = data_dirs(campaign, buffer)
    pilots = pilot_plan(campaign, profile, site.partition, site.qos, max(chains_of(jobs), default=1), checks)
    checks.raise_if_any()
    copy_out = None
    if pilots is not None:   # two claims of one job never share a work or output directory (fencing)
        input_dir, work_dir, out_dir, copy_out, db_plan = late_dirs(campaign, workdir, db_plan, buffer)
        pilots = with_buffer(pilots, campaign, buffer, jobs, checks, notes)
        checks.raise_if_any()
    if remote_reads is not None and remote_reads.access == "stage":
        # a claim's copies go to its own work directory (in the pilot's buffer, if any), never a shared one
        input_dir = stage_dir_expr(profile, None if pilots is not None else buffer.root_var, work_dir)
    container = container_plan(campaign, profile, runtime, items, db_plan, buffer.root_var, workdir,
                               checks, notes)
    checks.raise_if_any()
    scripts = [with_request(campaign, profile, site.partition, site.qos, container, s)
               for s in scripts_of(campaign, profile, jobs, buffer, checks, notes)]
    return Plan(campaign=campaign, spec_file=spec_src.file, profile=profile,
                profile_files=tuple(profile_files), partition_name=site.name, partition=site.partition,
                qos=site.qos, container=container,
                bb_system=profile.burst_buffer.system if buffer.writer else None, pool=buffer.pool,
                jobs=jobs if isinstance(jobs, StreamedJobs) else tuple(jobs), scripts=tuple(scripts),
                database=db_plan, input_dir_expr=input_dir,
                work_dir_expr=work_dir, out_dir_expr=out_dir, copy_out_expr=copy_out, notes=tuple(notes),
                commands=commands,
                checksum=checksum_plan(campaign.inputs.checksum, profile),
                chain_overcommit=campaign.jobs.overcommit and max(chains_of(jobs), default=0) > site.partition.cpus,
                cleanup_workdir=buffer.writer is None and "merge" in commands,
                scheduler=profile.scheduler.kind, launcher=launcher(profile),
                launch=launch_plan(campaign, profile, db_plan is not None),
                accounting=profile.keeps_records and scheduler_for(profile.scheduler.kind).accounting,
                finalize_request=finalize_request(campaign, profile, site.partition, site.qos),
                remote=remote_reads, export=exports,
                locality_wait=int(campaign.jobs.locality_wait) if campaign.jobs.locality == "prefer" else None,
                hdf5_helper=bool(campaign.merge and campaign.merge.hdf5) or bool(campaign.qa and campaign.qa.hdf5),
                succession=succession, pilots=pilots, quota_lines=quota_lines(profile, profile_src))


def _left_to(succession: Succession, items: Sequence[InputItem], key: str, src: Located,
             checks: Checks) -> Sequence[InputItem]:
    """The inputs this generation runs: the spec's, less what an earlier one keeps (done, in flight)."""
    if not succession.exclude:
        return items
    if isinstance(items, Listed):
        checks.spec_error(("inputs", key), (
            "this list file is large enough to be planned as a stream, and a later generation of a campaign "
            "cannot yet leave out the inputs an earlier one keeps from a stream; plan the new inputs as a "
            "campaign of their own"))
        return []
    return [i for i in items if i.path not in succession.exclude]


def _idle_cores_note(campaign: Campaign, pname: str, part: Partition, jobs: Sequence[Job], notes: List[str]) -> None:
    """Whole nodes held for far fewer chains than they have cores: say what it costs and what to change."""
    if not part.exclusive or not jobs:
        return
    chains = max(chains_of(jobs))
    if chains * 2 > part.cores_per_node:
        return
    node_hours = len(jobs) * campaign.jobs.nodes * campaign.walltime / 3600.0
    charged, used = node_hours * part.cores_per_node, node_hours * chains
    notes.append(
        f"each job holds whole {part.cores_per_node}-core nodes (partition '{pname}' is exclusive) for "
        f"{chains} chain(s) per node: up to {charged:,.0f} core-hours charged for {used:,.0f} used "
        f"({used / charged:.0%}); raise jobs.chains_per_node towards {part.cores_per_node} (more "
        "jobs.files_per_job or jobs.bytes_per_chain to feed them), or plan on a shared partition (site.partition)")


def _check_chains(campaign: Campaign, cpus: int, pname: str, checks: Checks) -> None:
    js = campaign.jobs
    if isinstance(js.chains_per_node, int) and js.chains_per_node > cpus and not js.overcommit:
        checks.spec_error(("jobs", "chains_per_node"), (
            f"{js.chains_per_node} chains per node but nodes of partition '{pname}' have "
            f"{cpus} CPUs; lower it or set jobs.overcommit: true."))


def checksum_plan(algo: str, profile: SiteProfile) -> Optional[ChecksumPlan]:
    """md5sum for md5; for adler32 the profile's xrdadler32 when it names one, else the
    plan's own bin/hpcrun-checksum.py run by the profile's Python."""
    if algo == "none":
        return None
    if algo == "md5":
        return ChecksumPlan("md5", "md5sum", "md5sum --", False,
                            "md5sum (GNU coreutils) must be on PATH on the compute nodes")
    if profile.tools.xrdadler32:
        return ChecksumPlan("adler32", profile.tools.xrdadler32, quote(profile.tools.xrdadler32),
                            False, "set tools.xrdadler32 in the site profile, or remove it to "
                            "use Python")
    python = profile.tools.python
    return ChecksumPlan("adler32", python,
                        f'{quote(python)} "$HPCRUN_PLAN_DIR/bin/hpcrun-checksum.py" adler32',
                        True, "set tools.python in the site profile")
