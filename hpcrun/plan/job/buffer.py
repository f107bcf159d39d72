"""The burst buffer: the spec's request checked against the site's system and pools, the
capacity each job needs, and the directive lines that ask for it."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from hpcrun.backends.burstbuffer.base import BufferRequest, Stage, Writer, writer_for
from hpcrun.model.site import Pool, SiteProfile
from hpcrun.model.spec import BurstBufferSpec, Campaign
from hpcrun.plan import checks as carried
from hpcrun.plan.checks import Checks
from hpcrun.plan.intake.inputs import InputItem
from hpcrun.plan.values import Job
from hpcrun.units import format_capacity, format_size, round_up

_BLANK_OR_DOLLAR = re.compile(r"[\s$\x00-\x1f\x7f]")


@dataclass(frozen=True)
class BufferChoice:
    """The burst-buffer system, pool and the variable naming the job's buffer (all None: none)."""

    writer: Optional[Writer] = None
    spec: Optional[BurstBufferSpec] = None
    pool: Optional[Pool] = None

    @property
    def root_var(self) -> Optional[str]:
        return self.writer.root_var(self.spec.access_mode) if (self.writer and self.spec) else None


def choose_buffer(campaign: Campaign, profile: SiteProfile, items: Sequence[InputItem], inputs_key: str,
                  checks: Checks) -> BufferChoice:
    bbspec, bbset = campaign.burst_buffer, profile.burst_buffer
    if bbspec is None:
        return BufferChoice()
    if bbset.system == "none":
        checks.spec_error(("burst_buffer",), (
            f"site profile '{profile.name}' has no burst buffer (system: none); remove the "
            "burst_buffer section or choose a site that has one."))
        return BufferChoice()
    writer = writer_for(bbset.system, bbset.directive, bbset.pool_required)
    pool = bbset.pool(bbspec.pool)
    if pool is None:
        checks.spec_error(("burst_buffer", "pool"), (
            f"pool '{bbspec.pool}' does not exist at '{profile.name}'; valid: "
            + ", ".join(p.name for p in bbset.pools) + "."))
    _check_access(campaign, bbspec, checks)
    _check_stages(bbspec, profile, checks)
    _check_staged_inputs(campaign, bbspec, profile, items, inputs_key, checks)
    if bbspec.capacity != "auto" and bbspec.capacity < 1:
        checks.spec_error(("burst_buffer", "capacity"), (
            "a burst buffer of 0 bytes holds nothing; give a size or 'auto'."))
    return BufferChoice(writer, bbspec, pool)


def _check_access(campaign: Campaign, bbspec: BurstBufferSpec, checks: Checks) -> None:
    if "private" in bbspec.access_mode and "striped" not in bbspec.access_mode and (
            bbspec.stage_inputs or bbspec.stage_outputs or bbspec.stage_in or bbspec.stage_out):
        checks.spec_error(("burst_buffer", "access_mode"), (
            "DataWarp cannot stage in or out of a private-only buffer; use striped or "
            "striped,private, or turn staging off."))
    if campaign.jobs.nodes > 1 and bbspec.access_mode == "private":
        checks.spec_error(("burst_buffer", "access_mode"), (
            "with several nodes, chain outputs must be visible to the merge step; use "
            "striped or striped,private."))


def _check_stages(bbspec: BurstBufferSpec, profile: SiteProfile, checks: Checks) -> None:
    """Explicit stage_in/stage_out items: one side on the filesystem, the other in the buffer."""
    stage_from = profile.burst_buffer.stage_from
    for kind in ("stage_in", "stage_out"):
        for i, item in enumerate(getattr(bbspec, kind)):
            incoming = kind == "stage_in"
            fs_side, bb_side = (item.source, item.destination) if incoming else (item.destination, item.source)
            fs_key, bb_key = ("source", "destination") if incoming else ("destination", "source")
            if not fs_side.startswith("/"):
                checks.spec_error(("burst_buffer", kind, i, fs_key), (
                    f"'{fs_side}' must be an absolute path on the parallel filesystem."))
            if bb_side.startswith("/") or ".." in bb_side.split("/"):
                checks.spec_error(("burst_buffer", kind, i, bb_key), (
                    f"'{bb_side}' is a path inside the job's burst buffer; write it "
                    "relative to the buffer (e.g. in/calib), without '..'."))
            carried.check_dw_values([(("burst_buffer", kind, i, fs_key), fs_side),
                                     (("burst_buffer", kind, i, bb_key), bb_side)], checks.spec_error)
            if incoming and stage_from and not _under_any(fs_side, stage_from):
                checks.spec_error(("burst_buffer", kind, i, "source"), (
                    f"'{fs_side}' cannot be staged in at '{profile.name}': stage-in reads "
                    "only from " + ", ".join(stage_from) + "."))


def _under_any(path: str, prefixes: Sequence[str]) -> bool:
    return any(path.startswith(pref.rstrip("/") + "/") for pref in prefixes)


def _check_staged_inputs(campaign: Campaign, bbspec: BurstBufferSpec, profile: SiteProfile,
                         items: Sequence[InputItem], inputs_key: str, checks: Checks) -> None:
    stage_from = profile.burst_buffer.stage_from
    if bbspec.stage_inputs and stage_from:
        bad_inputs = [i.path for i in items if not _under_any(i.path, stage_from)]
        if bad_inputs:
            checks.spec_error(("burst_buffer", "stage_inputs"), (
                f"'{bad_inputs[0]}' (and {len(bad_inputs) - 1} more) cannot be staged in at "
                f"'{profile.name}': stage-in reads only from " + ", ".join(stage_from)
                + "; copy them to scratch first or set stage_inputs: false."))
    if bbspec.stage_inputs:
        blank = next((i.path for i in items if _BLANK_OR_DOLLAR.search(i.path)), None)
        if blank is not None:
            carried.check_dw_values([(("inputs", inputs_key), blank)], checks.spec_error)
    if bbspec.stage_outputs:
        carried.check_dw_values([(("outputs", "location"), campaign.outputs.location)], checks.spec_error)


@dataclass
class Sizing:
    """Burst-buffer sizes of the jobs, and what went wrong or was rounded on the way."""

    rounded: int = 0
    rounding_example: str = ""
    too_big: Optional[List[str]] = None
    too_small: str = ""

    def size(self, choice: BufferChoice, campaign: Campaign, index: int,
             in_bytes: int) -> Tuple[Optional[int], Optional[int]]:
        """(needed, capacity) of one job's buffer, or (None, None) without a buffer."""
        bbspec, pool = choice.spec, choice.pool
        if not (choice.writer and bbspec and pool):
            return None, None
        if bbspec.capacity == "auto":
            # inputs + chain parts + merged outputs (parts stay until the job ends)
            out_bytes = in_bytes * campaign.outputs.size_ratio
            needed = int(math.ceil((in_bytes + 2 * out_bytes) * bbspec.safety_factor))
        else:
            needed = int(bbspec.capacity)
            floor = bb_floor(in_bytes, campaign.outputs.size_ratio, bbspec.stage_inputs, bbspec.stage_outputs)
            if needed < floor and not self.too_small:
                self.too_small = (f"job {index + 1} stages and writes {format_size(floor, binary=False)} "
                                  f"in its buffer ({_floor_parts(in_bytes, campaign, bbspec)})")
        needed = max(needed, 1)
        capacity = round_up(needed, pool.granularity)
        if capacity != needed:
            self.rounded += 1
            self.rounding_example = self.rounding_example or (
                f"{format_size(needed, binary=False)} -> {format_capacity(capacity)}")
        if capacity > pool_limit(pool):
            self.too_big = (self.too_big or []) + [f"job {index + 1} needs {format_capacity(capacity)}"]
        return needed, capacity

    def report(self, choice: BufferChoice, checks: Checks, notes: List[str]) -> None:
        pool, bbspec = choice.pool, choice.spec
        if self.rounded and pool:
            notes.append(f"burst-buffer capacity rounded up to the {format_capacity(pool.granularity)} "
                         f"granularity of pool '{pool.name}' for {self.rounded} job(s), "
                         f"e.g. {self.rounding_example}.")
        if self.too_big and pool:
            checks.spec_error(("burst_buffer", "capacity"), (
                f"{self.too_big[0]} ({len(self.too_big)} job(s) in all), more than the "
                f"{format_capacity(pool_limit(pool))} that pool '{pool.name}' can give one job (its "
                "max_per_job and total); use fewer files_per_job or a smaller safety_factor."))
        if self.too_small and bbspec is not None:
            checks.spec_error(("burst_buffer", "capacity"), (
                f"capacity {format_size(int(bbspec.capacity), binary=False)} is too small: {self.too_small}. "
                "A job that fills its buffer fails and can leave the burst-buffer node needing repair; "
                "use capacity: auto or at least that much."))


def pool_limit(pool: Pool) -> int:
    return min(x for x in (pool.max_per_job, pool.total, 2**63) if x)


def bb_floor(in_bytes: int, size_ratio: float, stage_inputs: bool, stage_outputs: bool) -> int:
    """Bytes a job certainly puts into its buffer: staged inputs, chain parts, merged outputs."""
    out_bytes = in_bytes * size_ratio
    return int(math.ceil((in_bytes if stage_inputs else 0) + out_bytes * (2 if stage_outputs else 1)))


def _floor_parts(in_bytes: int, campaign: Campaign, bbspec: BurstBufferSpec) -> str:
    out = format_size(int(in_bytes * campaign.outputs.size_ratio), binary=False)
    parts = [f"inputs {format_size(in_bytes, binary=False)}"] if bbspec.stage_inputs else []
    parts.append(f"chain parts {out}")
    if bbspec.stage_outputs:
        parts.append(f"merged outputs {out}")
    return " + ".join(parts)


def bb_lines(choice: BufferChoice, campaign: Campaign, job: Optional[Job], capacity: int,
             own_staging: bool = True) -> List[str]:
    """The directive lines of one script (``job`` None: an array's shared script); ``own_staging`` False:
    a pilot's, whose claims copy their inputs and outputs themselves (only the shared stage_in items)."""
    writer, bbspec, pool, root_var = choice.writer, choice.spec, choice.pool, choice.root_var
    if writer is None or bbspec is None or root_var is None:
        return []
    root = f"${root_var}/"
    stage_in = [Stage(s.source, root + s.destination, s.type) for s in bbspec.stage_in]
    stage_out = [Stage(root + s.source, s.destination, s.type) for s in bbspec.stage_out]
    if bbspec.stage_inputs and job is not None:
        stage_in = [Stage(i.path, f"{root}in/{os.path.basename(i.path)}", "file")
                    for i in job.inputs] + stage_in
    if bbspec.stage_outputs and own_staging:
        stage_out = [Stage(f"{root}out", campaign.outputs.location, "directory")] + stage_out
    pool_name = bbspec.pool or (pool.name if (pool and writer.always_pool) else None)
    req = BufferRequest(capacity=capacity, access_mode=bbspec.access_mode, type=bbspec.type,
                        pool=pool_name, stage_in=stage_in, stage_out=stage_out,
                        persistent=list(bbspec.persistent), nodes=campaign.jobs.nodes)
    return writer.lines(req)
