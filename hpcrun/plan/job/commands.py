"""The spec's commands: placeholders checked, turned into shell words, and what they imply."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from hpcrun.model.spec import Campaign
from hpcrun.plan import checks as carried
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.intake.inputs import InputItem
from hpcrun.plan.job.listed import Listed
from hpcrun.plan.site import SiteChoice
from hpcrun.units import format_duration

HDF5_HELPER = "bin/hpcrun-hdf5.py"


def commands_of(campaign: Campaign, items: Sequence[InputItem], site: SiteChoice, profile_name: str,
                checks: Checks, python: str = "python3") -> Dict[str, str]:
    """Shell words of each command the job runs, by name (chain, merge, count_events, qa, qa_hdf5,
    finalize). ``python`` runs the built-in HDF5 steps (the plan's bin/hpcrun-hdf5.py)."""
    commands: Dict[str, str] = {}
    _command(checks, commands, "chain", ("chain", "command"), campaign.chain.command, ph.CHAIN)
    merge, qa = campaign.merge, campaign.qa
    if merge and merge.command:
        _command(checks, commands, "merge", ("merge", "command"), merge.command, ph.MERGE)
    elif merge and merge.hdf5:
        _command(checks, commands, "merge", ("merge", "hdf5"), _hdf5(python, "merge", "--output", "{output}", *[
            w for d in merge.hdf5.datasets for w in ("--dataset", _literal(d))], "{parts}"), ph.MERGE | {"plan_dir"})
    if qa and qa.count_events:
        _command(checks, commands, "count_events", ("qa", "count_events"), qa.count_events, ph.COUNT)
    elif qa and qa.hdf5 and qa.hdf5.events_dataset:
        _command(checks, commands, "count_events", ("qa", "hdf5", "events_dataset"), _hdf5(
            python, "count", "--dataset", _literal(qa.hdf5.events_dataset), "{file}"), ph.COUNT | {"plan_dir"})
    if qa and qa.command:
        _command(checks, commands, "qa", ("qa", "command"), qa.command, ph.QA)
    if qa and qa.hdf5:
        _command(checks, commands, "qa_hdf5", ("qa", "hdf5"), _hdf5(python, "check", *[
            w for d in qa.hdf5.require for w in ("--require", _literal(d))], "{output}"), ph.QA | {"plan_dir"})
    _check_finalize(checks, commands, campaign, site, profile_name)
    _check_chain_needs(campaign, items, checks)
    _check_qa(campaign, checks)
    return commands


def _literal(text: str) -> str:
    """Text that must reach the command as written (placeholder braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


def _hdf5(python: str, *args: str) -> List[str]:
    """argv of a built-in HDF5 step: the plan's helper run by ``python``."""
    return [_literal(python), "{plan_dir}/" + HDF5_HELPER, *args]


def check_outputs(campaign: Campaign, items: Sequence[InputItem], checks: Checks) -> Optional[List[str]]:
    """Each input's output name (in the order of ``items``), or None after reporting why not."""
    bad = ph.check([campaign.outputs.pattern], ph.PATTERN, allow_env=False)
    if bad:
        checks.spec_error(("outputs", "pattern"), bad)
    elif "/" in ph.expand_pattern(campaign.outputs.pattern, stem="x", name="x"):
        checks.spec_error(("outputs", "pattern"), "the output name pattern cannot contain '/'.")
    else:
        stage_inputs = bool(campaign.burst_buffer and campaign.burst_buffer.stage_inputs)
        # a Listed's output names were checked as it was read, and are made with its jobs
        return carried.check_output_names(campaign.outputs.pattern, () if isinstance(items, Listed) else items,
                                          campaign.jobs.files_per_job,
                                          stage_inputs, checks.spec_error)
    return None


def _check_chain_needs(campaign: Campaign, items: Sequence[InputItem], checks: Checks) -> None:
    """What the chain command's placeholders need from the rest of the spec."""
    used = ph.used(campaign.chain.command)
    if used & {"db_socket", "db_port", "db_host", "db_defaults", "db_user"} and campaign.database is None:
        checks.spec_error(("chain", "command"), (
            "the chain command uses a database placeholder but the spec has no 'database' section."))
    if campaign.database and campaign.database.networking == "socket" and "db_port" in used:
        checks.spec_error(("chain", "command"), (
            "{db_port} is used but database.networking is 'socket'; set it to 'tcp' or use {db_socket}."))
    needs_events = used & {"first_event", "last_event", "nevents"}
    missing = None if not needs_events else (items.first_without_events if isinstance(items, Listed) else next(
        (i.path for i in items if i.events is None), None))
    if missing is not None:
        checks.spec_error(("chain", "command"), (
            f"the chain command uses {{{sorted(needs_events)[0]}}} but the number of events of "
            f"'{missing}' is unknown; give inputs.events or EVENTS in the list file, or slice "
            "with {chain} and {nchains} in the program."))
    js = campaign.jobs
    multi_chain = js.nodes > 1 or js.chains_per_node == "auto" or js.chains_per_node != 1
    if multi_chain and campaign.merge is None:
        checks.spec_error(("jobs", "chains_per_node"), (
            "more than one chain writes parts of each output, so a 'merge' command is needed."))


def _check_qa(campaign: Campaign, checks: Checks) -> None:
    qa = campaign.qa
    if qa and qa.count_events is None and qa.command is None and qa.hdf5 is None:
        checks.spec_error(("qa",), "qa needs count_events (for min_event_fraction), hdf5 or a command.")
    counted = qa is not None and (qa.count_events is not None or bool(qa.hdf5 and qa.hdf5.events_dataset))
    if qa and qa.command and not counted and (ph.used(qa.command) & {"events_in", "events_out"}):
        checks.spec_error(("qa", "command"), (
            "{events_in} and {events_out} are counted with qa.count_events or qa.hdf5.events_dataset, "
            "neither of which is given."))


def _check_finalize(checks: Checks, commands: Dict[str, str], campaign: Campaign, site: SiteChoice,
                    profile_name: str) -> None:
    """The finalize job's command and time limit (it runs on the campaign's partition)."""
    fin = campaign.finalize
    if fin is None:
        return
    _command(checks, commands, "finalize", ("finalize", "command"), fin.command, ph.FINALIZE)
    if fin.walltime is not None and fin.walltime > site.partition.max_walltime:
        checks.spec_error(("finalize", "walltime"), (
            f"finalize walltime {format_duration(fin.walltime)} exceeds the maximum "
            f"{format_duration(site.partition.max_walltime)} of partition '{site.name}' "
            f"(profile '{profile_name}')."))


def _command(checks: Checks, commands: Dict[str, str], name: str, path: Tuple[str, ...],
             argv: List[str], allowed: set) -> None:
    bad = ph.check(argv, allowed)
    if bad:
        checks.spec_error(path, bad)
    else:
        commands[name] = ph.to_shell(argv)
