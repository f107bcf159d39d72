"""Values that a generated line must carry, checked at plan time with file, line and key.

Shell words can carry anything (:mod:`hpcrun.shell` quotes them), but some lines have no
quoting: a scheduler directive (the backend says what its parser cannot carry),
a ``#DW`` directive (blank-separated ``key=value`` tokens), Shifter's ``--volume`` list
(``:`` and ``;`` separate its parts) and the job's ``tasks.tsv`` (TAB-separated, one line
per input). A value such a line cannot carry is refused here, before anything is written,
instead of surfacing later as a broken job or an internal error.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hpcrun.backends.burstbuffer.base import value_problem as dw_problem
from hpcrun.backends.scheduler import scheduler_for
from hpcrun.errors import InputError, Problem
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.intake.inputs import InputItem

Report = Callable[[Sequence[object], str], None]
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Checks:
    """Collects problems with their spec/profile positions, so all are reported at once."""

    def __init__(self, spec: Located, profile: Located):
        self.spec, self.profile = spec, profile
        self.problems: List[Problem] = []

    def spec_error(self, path: Sequence[object], message: str) -> None:
        file, line = self.spec.where(tuple(path))
        self.problems.append(Problem(file, line, ".".join(str(p) for p in path), message))

    def profile_error(self, path: Sequence[object], message: str) -> None:
        file, line = self.profile.where(tuple(path))
        self.problems.append(Problem(file, line, ".".join(str(p) for p in path), message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise InputError(self.problems)


def check_directive_values(campaign: Campaign, profile: SiteProfile, pname: str,
                           spec_error: Report, profile_error: Report) -> None:
    """Every spec or profile value written into a scheduler directive line."""
    sched = scheduler_for(profile.scheduler.kind)
    site = campaign.site
    spec_values: List[Tuple[Tuple[object, ...], Optional[str]]] = [
        (("name",), campaign.name), (("site", "partition"), site.partition), (("site", "qos"), site.qos),
        (("site", "account"), site.account), (("site", "reservation"), site.reservation)]
    spec_values += [(("site", "extra_sbatch", i), opt.partition("=")[2]) for i, opt in enumerate(site.extra_sbatch)]
    part = profile.partitions[pname]
    profile_values: List[Tuple[Tuple[object, ...], Optional[str]]] = [
        (("partitions", pname, "slurm_partition"), part.slurm_partition),
        (("partitions", pname, "default_qos"), part.default_qos),
        (("partitions", pname, "constraint"), part.constraint)]
    shifter = profile.containers.shifter
    if campaign.container.runtime == "shifter" and shifter is not None:
        spec_values.append((("container", "image"), campaign.container.image))
        spec_values += [(("container", "modules", i), m) for i, m in enumerate(campaign.container.modules)]
        profile_values += [(("containers", "shifter", "modules", i), m) for i, m in enumerate(shifter.modules)]
        for key in ("volume_source", "cache_mount"):
            value = getattr(shifter, key)
            why = sched.value_problem(value) or _volume_problem(value)
            if why:
                profile_error(("containers", "shifter", key), (
                    f"{value!r} cannot be written into Shifter's {sched.directive} --volume option: {why}."))
    for values, report in ((spec_values, spec_error), (profile_values, profile_error)):
        for path, value in values:
            why = sched.value_problem(value) if value is not None else ""
            if why:
                report(path, f"{value!r} cannot be written into an {sched.directive} line: {why}; use a value "
                             "without it.")


def _volume_problem(value: str) -> str:
    if any(c in value for c in ";:") or any(c.isspace() for c in value):
        return "';', ':' and blanks separate the parts of a volume map"
    return ""


def check_plan_dir(plan_dir: str, scheduler: str) -> str:
    """Why the plan directory cannot prefix the jobs' output file on a directive line, or ''."""
    sched = scheduler_for(scheduler)
    why = sched.value_problem(plan_dir)
    return f"{plan_dir!r} cannot be written into the jobs' {sched.directive} --output line: {why}" if why else ""


def check_dw_values(values: Sequence[Tuple[Tuple[object, ...], str]], spec_error: Report) -> None:
    """Spec values written into ``#DW`` lines (stage paths, the output location)."""
    for path, value in values:
        why = dw_problem(value)
        if why:
            spec_error(path, f"{value!r} cannot be written into a burst-buffer directive line: it "
                             f"contains {why}, and the directive grammar has no quoting.")


def check_table_values(items: Sequence[InputItem], inputs_key: str, spec_error: Report) -> None:
    """Input paths and stems go into tasks.tsv, one TAB-separated line per input."""
    if not (CONTROL.search("".join([i.path for i in items])) or CONTROL.search("".join([i.stem for i in items]))):
        return   # the usual answer, in one search (the loop below names the first culprit)
    for item in items:
        for what, value in (("path", item.path), ("name stem", item.stem)):
            if CONTROL.search(value):
                spec_error(("inputs", inputs_key), (
                    f"input {item.path!r} cannot be planned: its {what} contains a TAB, line break or "
                    "other control character, which the job's task table cannot carry; rename the file."))
                return


def check_output_names(pattern: str, items: Sequence[InputItem], per_job: int, stage_inputs: bool,
                       spec_error: Report) -> Optional[List[str]]:
    """Every input of the campaign gets its own output name, and every input of a job its own
    chain parts (``<stem>.part<k>``) and staged copy (``in/<file name>``): two inputs sharing
    one would silently overwrite each other's data. Returns the output names, input by input
    (None after a problem)."""
    if not (ph.used([pattern]) & {"stem", "name"}):
        spec_error(("outputs", "pattern"), (
            f"'{pattern}' gives every input the same output name, so the outputs of all inputs would "
            "overwrite each other; use {stem} or {name}, e.g. '{stem}.out'."))
        return None
    sample = ph.expand_pattern(pattern, stem="x", name="x.raw")
    if CONTROL.search(pattern):
        spec_error(("outputs", "pattern"), "the output name pattern cannot contain a TAB or another "
                                           "control character (the job's task table is TAB-separated).")
        return None
    if sample in ("", ".", ".."):
        spec_error(("outputs", "pattern"), f"'{pattern}' is not a usable file name.")
        return None
    quick = _unique_outputs(pattern, items, stage_inputs and per_job > 1)
    if quick is not None:
        return quick
    seen: Dict[str, str] = {}
    namer = ph.output_namer(pattern)
    for group in (items[s:s + per_job] for s in range(0, len(items), per_job)):
        # within one job, chain parts (by stem) and staged copies (by name) must differ too
        stems: Dict[str, str] = {}
        names: Dict[str, str] = {}
        several = len(group) > 1
        for item in group:
            name = item.path.rpartition("/")[2]   # os.path.basename, at 10^5 calls
            out = namer(item.stem, name)
            if out in ("", ".", "..") or CONTROL.search(out):
                spec_error(("outputs", "pattern"), f"input {item.path!r} would get the output name "
                                                   f"{out!r}, which is not a usable file name.")
                return None
            clash = seen.get(out) or (several and (stems.get(item.stem) or (
                names.get(name) if stage_inputs else None)))
            if clash:
                spec_error(("outputs", "pattern"), (
                    f"inputs {clash!r} and {item.path!r} would share the output name {out!r} (or, in one "
                    "job, the chain parts of stem '" + item.stem + "'); their outputs would overwrite each "
                    "other. Rename one of them, or use a pattern that tells them apart."))
                return None
            seen[out] = item.path
            if several:
                stems[item.stem] = names[name] = item.path
    return list(seen)   # in insertion order: input by input


def _unique_outputs(pattern: str, items: Sequence[InputItem], names_apart: bool) -> Optional[List[str]]:
    """The output names at C speed when nothing can clash (the usual, 10^5-10^6 inputs): names unique
    and usable, stems unique (so chain parts differ within a job), and file names unique where a job's
    inputs are staged side by side. None sends the loop above to find and name what clashes."""
    stems = [i.stem for i in items]
    names = [i.path.rpartition("/")[2] for i in items] if names_apart or "name" in ph.used([pattern]) else stems
    outs = list(map(ph.output_namer(pattern), stems, names))
    distinct = set(outs)
    if (len(distinct) != len(outs) or distinct & {"", ".", ".."} or CONTROL.search("".join(outs))
            or len(set(stems)) != len(stems) or (names_apart and len(set(names)) != len(names))):
        return None
    return outs
