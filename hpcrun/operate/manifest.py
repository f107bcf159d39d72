"""The manifest, read once into a typed value: the one contract between ``hpcrun plan`` and operate.

render/manifest.py writes ``manifest.json``; this module is the only place that reads its keys. Every
other module of operate (and report, api) uses the fields of :class:`Manifest`, so a new key is one
field here and its readers, found by the type checker. The per-job and per-script entries stay the
JSON's own dicts, typed as ``TypedDict`` (no copy of 10^6 job entries), and the job list is read a
line at a time as it is gone through (:class:`ManifestJobs`).

Versioned as before: a manifest without ``digests`` or ``submit`` was written by an hpcrun too old
for operate and is refused with the command that makes a new one; keys added since are optional
here, with the meaning their absence had.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from typing_extensions import NotRequired, TypedDict

from hpcrun.backends.scheduler import DEFAULT
from hpcrun.errors import InputError, Problem


class JobEntry(TypedDict):
    """One plan job (render/manifest.py ``job_entry``)."""

    index: int
    name: str
    chains_per_node: int
    inputs: List[str]
    input_sizes: List[int]
    input_events: List[Optional[int]]
    checksums: List[Optional[str]]
    input_bytes: int
    events: Optional[int]
    outputs: List[str]
    bb_capacity_bytes: Optional[int]


class ScriptEntry(TypedDict):
    """One script submit sends: an array, a per-job file, or a template and its table of headers."""

    path: str
    array: Optional[str]
    jobs: List[int]
    sha256: str
    name: NotRequired[str]
    headers: NotRequired[Optional[str]]
    headers_sha256: NotRequired[str]
    generation: NotRequired[int]


class FinalizeEntry(TypedDict):
    path: str
    sha256: str
    job_name: str
    after: str


class ExportEntry(TypedDict):
    """Where the supervisor sends outputs on, and how (the spec's ``outputs.export``)."""

    to: str
    location: str
    streams: int
    max_attempts: int
    backoff_s: float
    max_backoff_s: float
    timeout_s: float
    copy: List[str]
    ask: List[str]
    client_env: List[List[str]]


class EventsEntry(TypedDict):
    command: List[str]
    on: List[str]
    stall_after_s: Optional[float]
    timeout_s: float


class LocalityEntry(TypedDict):
    index: str
    wait_s: float


class Figures(TypedDict):
    files: int
    bytes: int


class FootprintPart(TypedDict):
    part: str             # outputs, logs, run records, queue, plan directory
    peak: Figures
    end: Figures


class FilesystemFootprint(TypedDict):
    """One filesystem the campaign writes to (render/manifest.py ``footprint_entry``)."""

    name: Optional[str]   # the profile's filesystems.<name>; None: under no declared filesystem
    path: str
    type: Optional[str]
    quota: Optional[Dict[str, Optional[int]]]
    peak: Figures
    end: Figures
    parts: List[FootprintPart]


class FootprintEntry(TypedDict):
    """The plan's forecast of files and bytes per filesystem, to hold what a campaign made against."""

    running: int
    filesystems: List[FilesystemFootprint]


@dataclass(frozen=True)
class Submit:
    """The manifest's ``submit`` table: what submit, track and the retry policy need of the site and spec."""

    scheduler: str = DEFAULT
    accounting: bool = True
    throttle: Optional[int] = None
    max_queued_jobs: Optional[int] = None          # the site's per-user limit
    min_poll_interval: float = 0.0
    max_attempts: Optional[int] = None
    retry_cancelled: bool = False
    max_total_attempts: Optional[int] = None
    retry: Mapping[str, Any] = field(default_factory=dict)    # one rule per failure class
    limits: Mapping[str, Any] = field(default_factory=dict)   # the partition's max walltime, memory, nodes


@dataclass(frozen=True)
class Cluster:
    """One cluster of a campaign on several (or one named cluster): its scripts and limits."""

    name: str
    scheduler: str
    accounting: bool = True
    share: float = 1.0
    max_queued_jobs: Optional[int] = None          # the campaign's cap on this cluster
    site_max_queued_jobs: Optional[int] = None     # the site's per-user limit
    run_prefix: str = ""
    scripts: List[ScriptEntry] = field(default_factory=list)
    capacity_jobs: Optional[int] = None
    profile: str = ""


@dataclass(frozen=True)
class Generation:
    """Which generation of the campaign this manifest is, and how it was planned."""

    number: int = 1
    reprocess: str = "none"
    directory: str = ""
    planned_by: str = "?"
    planned_at: Optional[str] = None


@dataclass(frozen=True)
class Manifest:
    """A plan directory's manifest as operate uses it."""

    campaign: str
    spec_digest: str
    profile_digest: str
    submit: Submit
    scripts: List[ScriptEntry]
    jobs: Sequence[JobEntry]
    total_jobs: int
    hpcrun_version: Optional[str] = None
    clusters: Tuple[Cluster, ...] = ()
    walltime_seconds: int = 0
    move_pending_after_s: Optional[float] = None
    finalize: Optional[FinalizeEntry] = None
    export: Optional[ExportEntry] = None
    locality: Optional[LocalityEntry] = None
    events: Optional[EventsEntry] = None
    charge: Optional[Mapping[str, Any]] = None
    targets: Mapping[str, Any] = field(default_factory=dict)
    inputs_remote: Optional[Mapping[str, Any]] = None
    generation: Generation = Generation()
    provenance: Mapping[str, Any] = field(default_factory=dict)
    # what the plan's summary shows (the Python API's PlanResult, `hpcrun plan --json`)
    profile: str = ""
    partition: Optional[str] = None
    qos: Optional[str] = None
    container: str = "none"
    burst_buffer: str = "none"
    totals: Mapping[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    launch: Mapping[str, Any] = field(default_factory=dict)          # in the batch step or launcher steps
    expected_rpcs: Mapping[str, Any] = field(default_factory=dict)   # what the plan asks of the controller
    pilots: Optional[Mapping[str, Any]] = None   # late binding: the queue and the pilots (None: arrays)
    footprint: Optional[FootprintEntry] = None   # files and bytes forecast per filesystem (None: planned before it)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """The typed manifest from its JSON (absent keys: what their absence meant when they were added)."""
        sub = data.get("submit") or {}
        digests = data.get("digests") or {}
        gen = data.get("generation") or {}
        jobs = data.get("jobs") or []
        return cls(
            campaign=str(data.get("campaign", "")), spec_digest=str(digests.get("spec", "")),
            profile_digest=str(digests.get("profile", "")), submit=_submit(sub),
            scripts=list(data.get("scripts") or []), jobs=jobs,
            total_jobs=int((data.get("totals") or {}).get("jobs", len(jobs))),
            hpcrun_version=data.get("hpcrun_version"),
            clusters=tuple(_cluster(c, sub.get("scheduler", DEFAULT)) for c in data.get("clusters") or []),
            walltime_seconds=int(data.get("walltime_seconds") or 0),
            move_pending_after_s=data.get("move_pending_after_s"),
            finalize=data.get("finalize"), export=data.get("export"), locality=data.get("locality"),
            events=data.get("events"), charge=data.get("charge"), targets=dict(data.get("targets") or {}),
            inputs_remote=data.get("inputs_remote"),
            generation=Generation(int(gen.get("number") or 1), gen.get("reprocess") or "none",
                                  gen.get("directory", ""), gen.get("planned_by") or "?", gen.get("planned_at")),
            provenance=dict(data.get("provenance") or {}),
            profile=str(data.get("profile", "")), partition=data.get("partition"), qos=data.get("qos"),
            container=str(data.get("container") or "none"), burst_buffer=str(data.get("burst_buffer") or "none"),
            totals=dict(data.get("totals") or {}), notes=list(data.get("notes") or []),
            launch=dict(data.get("launch") or {}), expected_rpcs=dict(data.get("expected_rpcs") or {}),
            pilots=data.get("pilots"), footprint=data.get("footprint"))

    @property
    def several_clusters(self) -> bool:
        return len(self.clusters) > 1


def _submit(sub: Mapping[str, Any]) -> Submit:
    return Submit(sub.get("scheduler", DEFAULT), bool(sub.get("accounting", True)), sub.get("throttle"),
                  sub.get("max_queued_jobs"), float(sub.get("min_poll_interval") or 0), sub.get("max_attempts"),
                  bool(sub.get("retry_cancelled", False)), sub.get("max_total_attempts"),
                  dict(sub.get("retry") or {}), dict(sub.get("limits") or {}))


def _cluster(c: Mapping[str, Any], kind: str) -> Cluster:
    return Cluster(c["name"], c.get("scheduler", kind), bool(c.get("accounting", True)), float(c.get("share") or 1.0),
                   c.get("max_queued_jobs"), c.get("site_max_queued_jobs"), c.get("run_prefix", ""),
                   list(c.get("scripts", [])), c.get("capacity_jobs"), str(c.get("profile", "")))


def read_manifest(plan_dir: Path, jobs: bool = True) -> Manifest:
    """The plan's manifest; ``jobs=False`` skips reading the per-job list (a status poll needs none),
    else the list is a :class:`ManifestJobs` where the layout allows, read as it is gone through."""
    return Manifest.from_dict(_read_raw(plan_dir, jobs))


def read_json(plan_dir: Path, jobs: bool = False) -> Dict[str, Any]:
    """The manifest's JSON as written (by default without its job list): what the Python API hands out
    as a plan's manifest."""
    return _read_raw(plan_dir, jobs)


MANIFEST = "manifest.json"   # the name render/plandir.py writes it under (tests/test_generations.py: the same)
_JOBS_KEY = '\n "jobs": ['   # the manifest's last key, at the top level (a string holds no raw newline)
_HEAD_BLOCK = 1 << 16


class ManifestJobs(Sequence[Dict[str, Any]]):
    """The manifest's job list, read line by line each time it is gone through (hpcrun writes one job
    a line): submitting, retrying or supervising a 10^6-job plan held the list parsed whole, 1.5 GB,
    where each caller only goes through it once."""

    def __init__(self, path: Path, offset: int, count: int, fd: int):
        # the file as it was when its head was read: a new generation's manifest renamed over it meanwhile
        # is read at the caller's next round (an open descriptor keeps this one readable until then)
        self.path, self.offset, self.total, self._fd = path, offset, count, fd

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        seen = 0
        with os.fdopen(os.dup(self._fd), "rb") as f:
            f.seek(self.offset)
            for line in f:
                text = line.strip()
                if text == b"]":
                    break
                try:
                    yield json.loads(text[:-1] if text.endswith(b",") else text)
                except ValueError as exc:
                    raise self._broken(f"job line {seen + 1} cannot be read: {exc}") from None
                seen += 1
        if seen != self.total:
            raise self._broken(f"lists {seen} jobs where its totals say {self.total}")

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return list(itertools.islice(self, *k.indices(self.total)))
        if not -self.total <= k < self.total:
            raise IndexError(k)
        return next(itertools.islice(self, k % self.total, None))

    def _broken(self, why: str) -> InputError:
        return InputError([Problem(str(self.path), None, "jobs", f"{why}; the plan directory was edited or is "
                                                                 "incomplete: plan the campaign again")])


def _head(path: Path, fd: int) -> Optional[Tuple[Dict[str, Any], Optional[int]]]:
    """The manifest without its (last, up to 10^6 entries long) ``jobs`` list, read only up to that
    list's first line (a poll of a 10^6-job plan reads its first few hundred KB, not 300 MB), and the
    list's byte offset when that line is one whole job (hpcrun's layout; None: another, e.g. an older
    hpcrun's, to be parsed whole). None when the file has no such list."""
    text = ""
    cut = -1
    with os.fdopen(os.dup(fd), encoding="utf-8", newline="") as f:   # no newline translation: offsets are the file's
        f.seek(0)
        while True:
            block = f.read(_HEAD_BLOCK)
            seen = len(text)
            text += block
            if cut < 0:
                cut = text.find(_JOBS_KEY, max(0, seen - len(_JOBS_KEY)))
            start = cut + len(_JOBS_KEY)
            if cut >= 0 and (text.find("\n", start + 1) >= 0 or not block):
                break   # the list's first line is in: enough to tell the layout
            if not block:
                return None
    try:
        head: Dict[str, Any] = json.loads(text[:cut].rstrip().rstrip(",") + "\n}")
    except ValueError:
        return None
    end = text.find("\n", start + 1)
    first = text[start + 1:end if end >= 0 else len(text)].strip()
    try:
        whole_job = text[start:start + 1] == "\n" and isinstance(json.loads(first.rstrip(",")), dict)
    except ValueError:   # "jobs": [] on one line, or a job over several lines
        whole_job = False
    return head, len(text[:start + 1].encode("utf-8")) if whole_job else None


def _from_head(path: Path, jobs: bool) -> Optional[Dict[str, Any]]:
    """The manifest from its head: without the job list, or with it as a ManifestJobs (None: parse it whole)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        found = _head(path, fd)
        if found is None:
            return None
        head, offset = found
        if not jobs:
            return head
        count = head.get("totals", {}).get("jobs")
        if offset is None or not isinstance(count, int) or count < 1:
            return None
        head["jobs"] = ManifestJobs(path, offset, count, fd)
        fd = -1   # the job list's now
        return head
    finally:
        if fd >= 0:
            os.close(fd)


def _read_raw(plan_dir: Path, jobs: bool) -> Dict[str, Any]:
    """The manifest's JSON: the head, and the job list as a :class:`ManifestJobs` where the layout allows."""
    path = plan_dir / MANIFEST
    try:
        data: Dict[str, Any] = _from_head(path, jobs) or json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(plan_dir), None, "", (
            "is not a plan directory (no manifest.json); create one with `hpcrun plan SPEC --out DIR`"))]) from None
    except (OSError, ValueError) as exc:
        raise InputError([Problem(str(path), None, "", f"cannot be read: {exc}")]) from None
    if "digests" not in data or "submit" not in data:
        raise InputError([Problem(str(path), None, "", (
            f"was written by hpcrun {data.get('hpcrun_version', '?')}, which did not record what submit needs; "
            "plan the campaign again with this hpcrun (`hpcrun plan SPEC --out DIR --force`)"))])
    return data


def manifest_id(plan_dir: Path) -> Tuple[int, int]:
    """Which manifest file is in place (a new generation renames another one over it)."""
    try:
        st = os.stat(plan_dir / MANIFEST)
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)
