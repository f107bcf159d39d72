"""The scheduler room: what hpcrun asks of a batch system, in words no scheduler owns.

A scheduler turns a neutral ``JobRequest`` into its script's directive lines, says which
shell lines give a job and a task their identity (``HPCRUN_JOB_ID``, ``HPCRUN_NODE``,
``HPCRUN_RANK`` ...), which command launches tasks, and answers the operate layer:
submit a script, list the queue, read the accounting records. Its job states are mapped here to
the neutral states the store keeps, so nothing above this folder knows a scheduler's commands or variables.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import threading
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Collection, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Type

from hpcrun.errors import HpcrunError
from hpcrun.shell import DirectiveValueError, Shell, directive_word

# ---- neutral job states (the store keeps these words) ------------------------------------

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED"})

INPUT_STATE_OF = {
    **dict.fromkeys(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"),
                    "submitted"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "STAGE_OUT", "SIGNALING",
                     "RESIZING"), "running"),
    "COMPLETED": "done",
    **dict.fromkeys(("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                     "PREEMPTED", "REVOKED", "LOST"), "failed"),
}


@functools.lru_cache(maxsize=1024)
def normalize_state(state: str) -> str:
    """``cancelled by 1001`` -> ``CANCELLED``; ``CANCELLED+`` -> ``CANCELLED``; empty -> ``UNKNOWN``."""
    word = state.strip().split(" ", 1)[0] if state.strip() else "UNKNOWN"
    return word.rstrip("+").upper()


def task_id(job_id: str, array_index: Optional[int]) -> str:
    """A job or an array task as the queue and the accounting name it: ``123`` or ``123_4``."""
    return job_id if array_index is None else f"{job_id}_{array_index}"


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=4096)
def parse_exit_code(text: str) -> Tuple[Optional[int], Optional[int]]:
    """An exit status ``7:0`` (code:signal) -> (7, 0); anything unparsable -> (None, None); a poll
    of 10^5 ended jobs sees a handful of distinct ones."""
    code, _, sig = text.strip().partition(":")
    try:
        return int(code), (int(sig) if sig else None)
    except ValueError:
        return None, None


# ---- errors -------------------------------------------------------------------------------

class SchedulerError(HpcrunError):
    """A scheduler command failed; the message carries its output verbatim."""

    exit_code = 3

    def words(self) -> str:
        """The scheduler's words on one line, bounded: what an outage record keeps."""
        return " ".join(str(self).split())[:1000]


class SubmitUncertain(SchedulerError):
    """A submission timed out or lost the controller mid-call: the job may or may not exist."""


class Unreachable(SchedulerError):
    """A daemon of the cluster (``daemon``) does not answer: nothing done, nothing learnt: an outage, not a verdict."""

    daemon: ClassVar[str] = "controller"

    def __init__(self, message: str, cluster: Optional[str] = None) -> None:
        super().__init__(message)
        self.cluster = cluster     # the named cluster that did not answer (None: the host's own)
        self.asked: Optional[str] = None   # the plan's cluster being asked, where a caller of several says so


class AccountingUnreachable(Unreachable):
    """The cluster's accounting does not answer (its controller may): what has ended is not known until
    it does, while the queue still tells what waits and what runs."""

    daemon: ClassVar[str] = "accounting"


# after an accounting outage, the controller's kept records arrive late: while it lasts and this long after, a job
# neither the queue nor the accounting lists may have run (never called lost, never submitted again)
ACCOUNTING_CATCHUP_S = 300.0


# ---- what goes in and what comes out -------------------------------------------------------

@dataclass(frozen=True)
class JobRequest:
    """Everything a batch job asks of the scheduler, as plain values (the plan builds it)."""

    name: str
    nodes: int
    walltime_s: int
    signal_before_s: int
    log_dir: str                          # the job's output file goes here, named by job name and id
    comment: str
    tasks_per_node: Optional[int] = None  # None with exclusive nodes
    tasks: Optional[int] = None
    exclusive: bool = False
    array: Optional[str] = None           # e.g. "0-99%10"
    partition: Optional[str] = None
    qos: Optional[str] = None
    account: Optional[str] = None
    reservation: Optional[str] = None
    constraint: Optional[str] = None
    requeue: bool = False                 # may the scheduler rerun it by itself (after a node failure)?
    runtime_options: Tuple[Tuple[str, Optional[str]], ...] = ()   # a container runtime's own options
    extra: Tuple[str, ...] = ()           # the spec's raw extra options, checked at plan time

    def but(self, **changes: Any) -> JobRequest:
        """A copy with some fields changed: dataclasses.replace without re-running __init__
        (a tenth of its cost; a 100k-job plan makes two per job). Fields only, no checks."""
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise TypeError(f"JobRequest has no field {sorted(unknown)}")
        new = object.__new__(JobRequest)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


@dataclass(frozen=True)
class Adjust:
    """What a resubmission changes against its script's own request (the retry policy decides)."""

    walltime_s: Optional[int] = None
    mem_bytes: Optional[int] = None
    exclude: Tuple[str, ...] = ()    # node names or node-list expressions the job must not run on
    nodelist: Tuple[str, ...] = ()   # the node(s) the job must run on (locality: where its inputs are cached)

    def __bool__(self) -> bool:
        return bool(self.walltime_s or self.mem_bytes or self.exclude or self.nodelist)


@dataclass
class Record:
    """One job or array task as the scheduler's accounting reports it (steps folded in)."""

    job_id: str            # 123, 123_4, or a pending array's 123_[5-9%2]
    raw_id: str            # the unique numeric id
    name: str
    state: str
    exit_code: str
    reason: str
    elapsed_s: Optional[float]
    cpu_s: Optional[float]
    alloc_cpus: Optional[int]
    nodes: str
    start: Optional[str]
    end: Optional[str]
    max_rss_bytes: Optional[int] = None
    req_mem_bytes: Optional[int] = None   # memory the job asked for, all nodes together


@functools.lru_cache(maxsize=64)   # one a state (Slurm has about 25)
def unchanged(state: str) -> Record:
    """The one shared record that says "still ``state``, as you knew" (see Scheduler.records)."""
    return Record("", "", "", state, "", "", None, None, None, "", None, None)


@dataclass
class Queued:
    """One job or array task as the queue lists it."""

    job_id: str          # 123 or 123_4
    array_job_id: str    # 123 for both
    name: str
    state: str
    reason: str
    raw_id: str = ""     # the unique numeric id


@dataclass(frozen=True)
class Maintenance:
    """A window in which the cluster runs nothing of ours (a maintenance reservation)."""

    name: str
    start: Optional[_dt.datetime]
    end: Optional[_dt.datetime]

    def overlaps(self, begin: _dt.datetime, seconds: float) -> bool:
        """Would a job starting at ``begin`` and running ``seconds`` meet this window?"""
        if self.end is not None and self.end <= begin:
            return False
        return self.start is None or self.start < begin + _dt.timedelta(seconds=seconds)


@dataclass(frozen=True)
class PartitionFacts:
    """A partition as the live scheduler describes it (for drafting and checking a site profile)."""

    name: str
    nodes: int
    cpus_per_node: int
    memory_per_node_mb: int
    max_time_s: Optional[int]           # None: no limit
    default: bool = False
    exclusive: bool = False             # whole nodes only (OverSubscribe=EXCLUSIVE)
    qos: Tuple[str, ...] = ()           # QOS allowed ("ALL": empty)


@dataclass(frozen=True)
class PoolFacts:
    name: str
    total_bytes: Optional[int]
    granularity_bytes: Optional[int]


@dataclass(frozen=True)
class ClusterFacts:
    """What a cluster says of itself: partitions, limits, QOS, burst-buffer pools."""

    name: str
    partitions: Tuple[PartitionFacts, ...]
    max_array_size: Optional[int] = None
    max_submit_jobs: Optional[int] = None       # per user (the association's MaxSubmitJobs)
    qos_max_wall_s: Tuple[Tuple[str, Optional[int]], ...] = ()
    burst_buffer: str = ""                      # the plugin, e.g. "lua" or "datawarp" ("" none)
    pools: Tuple[PoolFacts, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """What an account may still spend (association limits against its usage), in TRES-minutes.

    ``limits`` maps a TRES (cpu, billing) to its group limit for the account and for this user's own
    association (the smaller of what is left counts); ``per_job`` to the most one job may use."""

    account: str
    cluster: Optional[str]
    limits: Tuple[Tuple[str, str, int], ...] = ()       # (scope account|user, tres, minutes)
    used: Tuple[Tuple[str, str, float], ...] = ()       # (scope, tres, minutes used so far)
    per_job: Tuple[Tuple[str, int], ...] = ()            # (tres, minutes): MaxTRESMins

    def left(self, tres: str) -> Optional[Tuple[float, int]]:
        """(minutes left, the limit they are left of) of the tightest limit on ``tres``; None: no limit."""
        used = {(s, t): u for s, t, u in self.used}
        best: Optional[Tuple[float, int]] = None
        for scope, t, limit in self.limits:
            if t == tres:
                left = limit - used.get((scope, t), 0.0)
                if best is None or left < best[0]:
                    best = (left, limit)
        return best


@dataclass(frozen=True)
class Launch:
    """How the batch script starts tasks: the default command, and where its own output goes."""

    command: Tuple[str, ...]
    log_name: str                         # file in chains/ holding the launcher's own output
    step_rpcs: int = 0                    # controller RPCs one launched step sends from the job's user
    step_end_rpcs: int = 0                # and from the node's step daemon when it ends


class Pace:
    """How this process's scheduler commands go (issue 46): one at a time (a campaign's supervisor never
    sends two at once), each timed. A command of ``slow_s`` or more marks the scheduler slow (a throttled
    libslurm sleeps and retries without a word) until a round passes without one; the supervisor then
    polls less often instead of piling up timeouts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # a command this long (HPCRUN_SCHEDULER_SLOW, seconds) means the scheduler is slow
        self.slow_s = float(os.environ.get("HPCRUN_SCHEDULER_SLOW") or 10)
        # how long one command may take before it counts as lost (HPCRUN_SCHEDULER_TIMEOUT, seconds)
        self.timeout_s = float(os.environ.get("HPCRUN_SCHEDULER_TIMEOUT") or 120)
        self.slowest_s = 0.0                       # this round's slowest command
        self.slow_since: Optional[_dt.datetime] = None
        self.commands = 0                          # run by this process: what a benchmark counts

    @contextmanager
    def command(self) -> Iterator[Callable[[], None]]:
        """Hold the lock for one command; the caller calls what this yields when the command answered.
        Only an answer counts towards slowness: a command that fails (a daemon down) is the outage's
        business, and must not stretch the pause while the supervisor should watch the outage end."""
        with self._lock:
            started = time.monotonic()
            answered: List[bool] = []
            try:
                yield lambda: answered.append(True)
            finally:
                took = time.monotonic() - started
                self.commands += 1
                if answered:
                    self.slowest_s = max(self.slowest_s, took)
                    if took >= self.slow_s and self.slow_since is None:
                        self.slow_since = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=took)

    def end_round(self) -> float:
        """The round's slowest command in seconds; a round without a slow one ends the slow spell."""
        slowest, self.slowest_s = self.slowest_s, 0.0
        if slowest < self.slow_s:
            self.slow_since = None
        return slowest


PACE = Pace()   # one per process: its commands never overlap


# ---- the scheduler -------------------------------------------------------------------------

class Scheduler(ABC):
    """A batch system: directive lines and identity for the renderer, queries for operate."""

    name: ClassVar[str] = ""
    script_suffix: ClassVar[str] = ".sh"
    directive: ClassVar[str] = "#"
    launch: ClassVar[Launch]
    task_env: ClassVar[Tuple[str, ...]] = ()       # variables every task gets (containers pass them)
    task_env_patterns: ClassVar[Tuple[str, ...]] = ()
    node_env: ClassVar[str] = ""   # the variable node_identity reads its node's name from ("": the host's name)
    accounting: ClassVar[bool] = True              # keeps records of ended jobs (``records`` answers)
    cancel_command: ClassVar[str] = ""             # what an operator runs to cancel a job (for messages)
    # the process behind each neutral daemon word (controller, accounting), for messages
    daemons: ClassVar[Dict[str, str]] = {}
    node_cpus: ClassVar[str] = '""'                 # shell: the CPUs the job holds on this node

    def __init__(self, cluster: Optional[str] = None) -> None:
        self.cluster = cluster      # one of several clusters the scheduler reaches (None: its own)

    def cancel_hint(self, job_id: str) -> str:
        """How an operator cancels ``job_id``, for a message (the batch system's own command)."""
        return f"{self.cancel_command} {job_id}" if self.cancel_command else f"cancel job {job_id}"

    def unanswered(self, daemon: str) -> str:
        """Ask ``daemon`` (controller, accounting) whether it answers: '' when it does, else its words."""
        return ""

    def daemon_name(self, daemon: str) -> str:
        """``controller`` -> ``controller (slurmctld)``: the neutral word and the site's process."""
        process = self.daemons.get(daemon)
        return f"{daemon} ({process})" if process else daemon

    # -- rendering ------------------------------------------------------------------------
    @abstractmethod
    def value_problem(self, text: str) -> str:
        """Why ``text`` cannot be a value on a directive line, or ''."""

    def value(self, value: object) -> Shell:
        """A value checked for a directive line (refused values never reach a script)."""
        text = str(value)
        why = self.value_problem(text)
        if why:
            raise DirectiveValueError(f"{text!r} cannot be written into an {self.directive} line: {why}")
        return directive_word(text)

    @abstractmethod
    def options(self, request: JobRequest) -> List[str]:
        """The directive options of one job, each a checked ``--name[=value]`` word."""

    def directive_lines(self, request: JobRequest) -> List[str]:
        return [f"{self.directive} {o}" for o in self.options(request)]

    @abstractmethod
    def launch_options(self, nodes: str, tasks: str, per_node: str, *, overcommit: bool = False,
                       step: bool = True) -> List[str]:
        """The launcher's options for ``tasks`` tasks on ``nodes`` nodes (shell words; values may be
        ``"$VAR"``). ``step``: a step inside the job's allocation that may overlap others and
        must not take the job down when one task fails."""

    @abstractmethod
    def extra_problem(self, option: str) -> str:
        """Why a raw extra option from a spec cannot be passed on, or ''."""

    @abstractmethod
    def job_identity(self, array: bool) -> List[str]:
        """Shell lines exporting HPCRUN_JOB_ID, HPCRUN_NODES (and HPCRUN_ARRAY_INDEX for arrays)."""

    @abstractmethod
    def task_identity(self) -> List[str]:
        """Shell lines a launched task runs first: HPCRUN_RANK, HPCRUN_NRANKS, HPCRUN_NODE."""

    @abstractmethod
    def node_identity(self) -> List[str]:
        """Shell lines a per-node helper runs first: HPCRUN_NODE."""

    def batch_task_identity(self) -> List[str]:
        """What a task started in the batch step (launch_in_batch) runs first: its rank from the job."""
        return ["export HPCRUN_RANK=${HPCRUN_TASK_RANK:?started by launch_in_batch}",
                "export HPCRUN_NRANKS=${HPCRUN_TASK_COUNT:?started by launch_in_batch}", *self.node_identity()]

    def template_context(self, options: Sequence[str]) -> Dict[str, object]:
        """Names older site templates used for this scheduler's options (kept working)."""
        return {}

    # -- operating -------------------------------------------------------------------------
    @abstractmethod
    def submit(self, script: Path, *, name: str, array: Optional[str] = None, dependency: str = "",
               adjust: Optional[Adjust] = None, text: Optional[str] = None) -> str:
        """Submit a script under a job name, with a retry's changes; return its job id (SubmitUncertain
        when unknown). With ``text``, that is the script, handed over on standard input (no file
        is written for it); ``script`` then only names it and its directory is the job's."""

    @abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel these jobs or array tasks (``123``, ``123_4``); one that already ended is no error."""

    @abstractmethod
    def dependency(self, kind: str, job_ids: Sequence[str]) -> str:
        """Run after these jobs ended (kind: any, ok, notok) in the scheduler's own spelling."""

    @abstractmethod
    def records(self, job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                known: Optional[Mapping[str, str]] = None,
                in_flight: Optional[Collection[str]] = None) -> Dict[str, Record]:
        """One accounting query over these jobs (arrays by their array id) or job names.

        ``known`` maps job ids to the state the caller last recorded: a job still in that state
        (and not ended) may be answered with a bare :func:`unchanged` record, whose other fields
        are empty; the steady poll of a large campaign then costs little beyond the query.
        ``in_flight``: the jobs the caller still has in flight; only those of them that ended get what
        their steps tell (the memory high-water mark, a step killed for memory), asked of the jobs that
        ended alone - the steps of jobs still running are never read.
        """

    @abstractmethod
    def queue(self, *, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
              expand: bool = True, ended: bool = False) -> List[Queued]:
        """Jobs in the queue (array tasks one each unless not ``expand``; ``ended``: recently ended too)."""

    def queued_count(self, user: str) -> int:
        """How many jobs and array tasks this user has queued or running."""
        return len(self.queue(user=user))

    @abstractmethod
    def since_text(self, moment: _dt.datetime) -> str:
        """A start time for ``records`` a little before ``moment``."""

    @abstractmethod
    def parse_time(self, text: Optional[str]) -> Optional[_dt.datetime]:
        """A time from a record -> an aware UTC datetime (None when unknown)."""

    @abstractmethod
    def state_of(self, job_id: str) -> Optional[str]:
        """One job's state by its id (None when the scheduler does not know it)."""

    def maintenance(self) -> List[Maintenance]:
        """The cluster's maintenance windows now and ahead (raises Unreachable when it does not answer)."""
        return []

    def describe(self) -> ClusterFacts:
        """The cluster as the scheduler describes it now (raises SchedulerError when it cannot)."""
        raise SchedulerError(f"the {self.name} backend cannot describe its cluster")

    def known_clusters(self) -> Optional[List[str]]:
        """The clusters this scheduler can reach by name (None: it cannot say)."""
        return None

    def allocation(self, account: Optional[str]) -> Allocation:
        """The account's (None: the user's default account) limits and usage; raises SchedulerError
        when the scheduler cannot be asked."""
        raise SchedulerError(f"the {self.name} backend cannot say what an account may still spend")

    @staticmethod
    def budget_reason(reason: str) -> bool:
        """Does this pending reason mean the allocation is spent (the job will not start by itself)?"""
        return False

    @abstractmethod
    def submit_command(self, script: str) -> str:
        """The command a person types to submit this script by hand."""

    @abstractmethod
    def job_env(self) -> Optional[str]:
        """The id of the job this process runs in, or None outside a job."""


_REGISTRY: Dict[str, Type[Scheduler]] = {}


def register(cls: Type[Scheduler]) -> Type[Scheduler]:
    """Class decorator: make a scheduler known by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> Dict[str, Type[Scheduler]]:
    return dict(_REGISTRY)
