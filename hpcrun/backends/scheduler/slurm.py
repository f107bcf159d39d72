"""Slurm: the scheduler backend. Runs sbatch/sacct/squeue and parses what they print, writes
``#SBATCH`` lines and the ``SLURM_*`` identity lines of jobs and tasks.

Nothing else in hpcrun names Slurm's commands or variables (a test greps for it). ``SBATCH_*`` variables are removed
from sbatch's environment because they silently override the script's own
``#SBATCH`` lines (hpc-reference §8.1).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from hpcrun.backends.scheduler.base import (
    TERMINAL,
    Adjust,
    JobRequest,
    Launch,
    Queued,
    Record,
    Scheduler,
    SchedulerError,
    SubmitUncertain,
    register,
    unchanged,
)
from hpcrun.units import format_duration

TRANSIENT = ("Socket timed out", "Unable to contact slurm controller", "Slurm temporarily unable",
             "Resource temporarily unavailable", "Connection refused")
# for sbatch only errors that prove the controller never took the job: after a timeout the job
# may exist, and submitting again would duplicate it
NOT_REACHED = ("Unable to contact slurm controller", "Connection refused")


class SlurmError(SchedulerError):
    """A Slurm command failed; the message carries its output verbatim."""


class SbatchUncertain(SlurmError, SubmitUncertain):
    """sbatch timed out or lost the controller mid-call: the job may or may not exist."""


@dataclass
class JobState:
    job_id: str            # as sacct prints it: 123 or 123_4 for an array task
    raw_id: str            # the unique numeric id (SLURM_JOB_ID inside the job)
    name: str
    state: str             # first word of State (e.g. CANCELLED, not "CANCELLED by 1001")
    exit_code: str
    reason: str
    elapsed: str
    start: str
    end: str
    nodes: str

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _env() -> Optional[Dict[str, str]]:
    """The environment for Slurm commands: ours without ``SBATCH_*`` (None: ours as it is, the cheap case)."""
    if not any(k.startswith("SBATCH_") for k in os.environ):
        return None
    return {k: v for k, v in os.environ.items() if not k.startswith("SBATCH_")}


def _run(argv: Sequence[str], retries: int = 3, cwd: Optional[Path] = None,
         transient: Sequence[str] = TRANSIENT) -> subprocess.CompletedProcess:
    """Run a Slurm command, retrying transient controller errors with backoff."""
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, env=_env(), cwd=cwd,
                                  timeout=120)
        except FileNotFoundError:
            raise SlurmError(f"'{argv[0]}' was not found: is Slurm installed and on PATH?") from None
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after 120 s")
        if proc.returncode == 0 or not any(t in proc.stderr for t in transient) or attempt == retries:
            return proc
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")


def sbatch(script: Path, extra: Iterable[str] = ()) -> str:
    """Submit a script; return its job id. sbatch's rejection is shown verbatim.

    Raises SbatchUncertain when the outcome is unknown (timeout, controller lost after the
    request went out): the caller must look for the job under its tag before trying again.
    """
    proc = _run(["sbatch", "--parsable", *extra, str(script)], cwd=script.parent, transient=NOT_REACHED)
    if proc.returncode != 0:
        text = proc.stderr.strip() or proc.stdout.strip()
        if proc.returncode == 124 or (any(t in text for t in TRANSIENT) and not any(t in text for t in NOT_REACHED)):
            raise SbatchUncertain(f"sbatch of {script} did not finish cleanly; the job may exist:\n{text}")
        raise SlurmError(f"sbatch rejected {script}:\n{text}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id for {script}: {proc.stdout!r}")
    return job_id


SACCT_FIELDS = "JobID,JobIDRaw,JobName%64,State,ExitCode,Reason,Elapsed,Start,End,NodeList"


def parse_sacct(text: str) -> List[JobState]:
    rows = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 10:
            continue
        job_id, raw, name, state, exit_code, reason, elapsed, start, end, nodes = parts
        if "." in job_id:  # a step row
            continue
        rows.append(JobState(job_id, raw, name, state.split(" ")[0].rstrip("+"), exit_code, reason,
                             elapsed, start, end, nodes))
    return rows


def sacct(job_ids: Sequence[str], since: str = "now-30days") -> List[JobState]:
    """One sacct call for all jobs (allocation rows only)."""
    if not job_ids:
        return []
    proc = _run(["sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-j", ",".join(job_ids),
                 "-o", SACCT_FIELDS.replace("%64", "")])
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed: {proc.stderr.strip()}")
    return parse_sacct(proc.stdout)


# ---- campaign-level queries: tags, accounting records, queue size -------------------------

ACCT_FIELDS = ("JobID", "JobIDRaw", "JobName", "State", "ExitCode", "Reason", "ElapsedRaw", "TotalCPU",
               "AllocCPUS", "NodeList", "Start", "End", "ReqMem", "MaxRSS")   # MaxRSS last: steps read it


AcctRecord = Record   # the neutral record, filled from sacct


_CPU_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_MEM = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}


def parse_cpu_time(text: str) -> Optional[float]:
    """sacct's TotalCPU: ``[D-][HH:]MM:SS[.mmm]`` -> seconds."""
    m = _CPU_TIME.match(text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = m.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def parse_mem(text: str) -> Optional[int]:
    """sacct's MaxRSS (``1234K``, ``2.5G``, ``0``) -> bytes (called for every step of every job)."""
    text = text.strip()
    if not text:
        return None
    unit = text[-1]
    factor = _MEM.get(unit) if unit.isalpha() else 1
    number = text[:-1] if unit.isalpha() else text
    if factor is None or not number or number.startswith(("+", "-")) or "_" in number:
        return None
    try:
        return int(float(number) * factor)
    except ValueError:
        return None


def parse_req_mem(text: str, cpus: Optional[int]) -> Optional[int]:
    """sacct's ReqMem -> bytes for the whole job: ``16G`` (22.05: the job's memory TRES), or the older
    ``4000Mc`` (per CPU: times the allocated CPUs) and ``16Gn`` (per node, taken as it is)."""
    text = text.strip()
    per_cpu = text.endswith("c")
    mem = parse_mem(text[:-1] if text.endswith(("c", "n")) else text)
    if mem is None or mem <= 0:
        return None
    return mem * (cpus or 1) if per_cpu else mem


def _time_or_none(text: str) -> Optional[str]:
    return None if text in ("", "Unknown", "None") else text


def since_text(moment: _dt.datetime, slack_s: float = 300.0) -> str:
    """A sacct -S value a little before ``moment`` (in local time, as sacct reads it; slack for clock skew)."""
    return (moment - _dt.timedelta(seconds=slack_s)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@functools.lru_cache(maxsize=65536)
def parse_time(text: Optional[str]) -> Optional[_dt.datetime]:
    """sacct's local ISO time -> an aware UTC datetime (None for Unknown); many jobs share a second."""
    if not text:
        return None
    try:
        return _dt.datetime.fromisoformat(text).astimezone(_dt.timezone.utc)
    except ValueError:
        return None


def parse_acct(text: str, known: Optional[Mapping[str, str]] = None) -> Dict[str, AcctRecord]:
    """sacct -P output with ACCT_FIELDS (steps included) -> one record per job or task id.

    A job whose state is the one ``known`` gives, and has not ended, gets the shared
    :func:`unchanged` record: its line is not parsed further, nor are its steps.
    """
    jobs: Dict[str, AcctRecord] = {}
    rss: Dict[str, int] = {}
    width = len(ACCT_FIELDS)
    known = known or {}
    cpu_memo: Dict[str, Optional[float]] = {}
    req_memo: Dict[Tuple[str, Optional[int]], Optional[int]] = {}
    oom: Set[str] = set()
    for line in text.splitlines():
        head, _, rest = line.partition("|")
        owner, dot, _step = head.partition(".")
        if dot:  # a step: 123.batch, 123_4.0 - only its memory (the last field) and an OOM kill matter
            mem = parse_mem(rest.rpartition("|")[2]) if rest.count("|") == width - 2 else None
            if mem is not None and mem > rss.get(owner, -1):
                rss[owner] = mem
            if "|OUT_OF_MEMORY" in rest:
                oom.add(owner)
            continue
        parts = line.split("|")
        if len(parts) != width:
            continue
        job_id, raw, name, state, exit_code, reason, elapsed, cpu, alloc, nodes, start, end, req, _rss = parts
        state = state.split(" ")[0].rstrip("+")
        if known.get(job_id) == state and state not in TERMINAL:
            jobs[job_id] = unchanged(state)
            continue
        cpus = int(alloc) if alloc.isdigit() else None
        cpu_s = cpu_memo[cpu] if cpu in cpu_memo else cpu_memo.setdefault(cpu, parse_cpu_time(cpu))
        req_key = (req, cpus)
        req_b = req_memo[req_key] if req_key in req_memo else req_memo.setdefault(req_key, parse_req_mem(req, cpus))
        jobs[job_id] = AcctRecord(
            job_id, raw, name, state, exit_code, reason, float(elapsed) if elapsed.isdigit() else None, cpu_s,
            cpus, nodes, _time_or_none(start), _time_or_none(end), req_mem_bytes=req_b)
    for owner, mem in rss.items():
        rec = jobs.get(owner)
        if rec is not None and rec.raw_id:   # never the shared unchanged record
            rec.max_rss_bytes = mem
    _fold_step_oom(jobs, oom)
    return jobs


def _fold_step_oom(jobs: Dict[str, AcctRecord], oom: Set[str]) -> None:
    """A job that failed after the kernel killed one of its steps for memory (the step is
    OUT_OF_MEMORY, the job often just FAILED with the chains' exit code) ran out of memory."""
    for owner in oom:
        rec = jobs.get(owner)
        if rec is not None and rec.raw_id and rec.state == "FAILED":
            rec.state = "OUT_OF_MEMORY"


def sacct_records(job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                  known: Optional[Mapping[str, str]] = None) -> Dict[str, AcctRecord]:
    """One sacct call over these jobs (arrays by their array id) or job names, since ``since``."""
    if not job_ids and not names:
        return {}
    argv = ["sacct", "-n", "-P", "-S", since, "-E", "now", "-o", ",".join(ACCT_FIELDS)]
    if job_ids:
        argv += ["-j", ",".join(job_ids)]
    if names:
        argv += ["--name", ",".join(names)]
    proc = _run(argv)
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return parse_acct(proc.stdout, known)


QueuedJob = Queued     # the neutral queue row, filled from squeue (%A gives raw_id)


def squeue_jobs(*, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
                expand: bool = True, ended: bool = False) -> List[QueuedJob]:
    """Jobs in the queue, array tasks one per line (``-r``) unless ``expand`` is False.

    ``ended`` adds jobs that ended in the last MinJobAge seconds (``--states=all``).
    """
    argv = ["squeue", "-h", "-o", "%i|%F|%j|%T|%R|%A"]
    if expand:
        argv.append("-r")
    if ended:
        argv.append("--states=all")
    if job_ids:
        argv += ["-j", ",".join(job_ids)]
    if names:
        argv += ["--name", ",".join(names)]
    if user:
        argv += ["-u", user]
    proc = _run(argv)
    if proc.returncode != 0:
        text = proc.stderr.strip()
        if "Invalid job id" in text:  # every id already left the queue
            return []
        raise SlurmError(f"squeue failed: {text}")
    out = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) < 5:
            continue
        # %R may itself hold a "|"; the raw id (%A) is all digits, and a squeue (or a stand-in)
        # that prints only the first five fields gives none
        raw = parts.pop() if len(parts) > 5 and parts[-1].isdigit() else ""
        job_id, array_job_id, name, state = parts[:4]
        out.append(QueuedJob(job_id, array_job_id, name, state, "|".join(parts[4:]), raw))
    return out


def queued_count(user: str) -> int:
    """How many jobs and array tasks this user has queued or running (what MaxSubmitJobs counts)."""
    return len(squeue_jobs(user=user))


# ---- the backend ------------------------------------------------------------------------

# sbatch options hpcrun writes itself; setting them through the spec's extra options would bypass checks
MANAGED = {
    "--job-name": "name", "--partition": "site.partition", "--qos": "site.qos",
    "--account": "site.account", "--reservation": "site.reservation", "--time": "walltime",
    "--nodes": "jobs.nodes", "--array": "jobs.array and jobs.throttle", "--output": "(the plan)",
    "--signal": "the site profile's signal_before_timeout", "--comment": "(the campaign tag)",
    "--image": "container.image", "--volume": "the database payload cache",
    "--module": "container.modules", "--exclusive": "the partition's exclusive setting",
    "--ntasks-per-node": "jobs.chains_per_node", "--constraint": "the partition's constraint",
    "--bb": "burst_buffer", "--bbf": "burst_buffer",
    "--requeue": "retry (hpcrun retries failed jobs itself)", "--no-requeue": "retry (always set)",
}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def adjust_options(adjust: Optional[Adjust]) -> List[str]:
    """sbatch options overriding the script's #SBATCH lines for a retry (command-line options win)."""
    if not adjust:
        return []
    out = []
    if adjust.walltime_s:
        out.append(f"--time={format_duration(adjust.walltime_s)}")
    if adjust.mem_bytes:
        out.append(f"--mem={-(-adjust.mem_bytes // 2**20)}M")
    if adjust.exclude:
        out.append("--exclude=" + ",".join(adjust.exclude))
    return out


@functools.lru_cache(maxsize=64)
def _shared_options(cls: type, request: JobRequest) -> Tuple[str, ...]:
    return tuple(cls().shared_options(request))


@register
class Slurm(Scheduler):
    """Slurm 22.05 and later, with or without slurmdbd (the profile's ``accounting``)."""

    name = "slurm"
    script_suffix = ".sbatch"
    cancel_command = "scancel"
    directive = "#SBATCH"
    launch = Launch(command=("srun",), log_name="srun.log")
    # what srun gives every task; a container that clears the environment must pass these on
    task_env = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURMD_NODENAME")
    task_env_patterns = ("SLURM_*",)

    def value_problem(self, text: str) -> str:
        # sbatch reads a directive line as words, removing double quotes and nothing else
        if _CONTROL.search(text):
            return "it contains a line break or another control character"
        if '"' in text:
            return "it contains a double quote, which sbatch's directive parser removes"
        return ""

    def _opt(self, name: str, value: object = None) -> str:
        return name if value is None else f"{name}={self.value(value)}"

    def options(self, request: JobRequest) -> List[str]:
        # a job's name is its own; the rest is shared by the jobs of a plan (100k per-job scripts)
        return [self._opt("--job-name", request.name), *_shared_options(type(self), request.but(name=""))]

    def shared_options(self, r: JobRequest) -> List[str]:
        """Every option but the job name, in directive order."""
        opts: List[str] = []
        for key, value in (("--partition", r.partition), ("--qos", r.qos), ("--account", r.account),
                           ("--reservation", r.reservation), ("--constraint", r.constraint)):
            if value:
                opts.append(self._opt(key, value))
        opts.append(self._opt("--nodes", r.nodes))
        if r.exclusive:
            opts.append("--exclusive")
        elif r.tasks_per_node is not None:
            opts.append(self._opt("--ntasks-per-node", r.tasks_per_node))
        if r.tasks is not None:
            opts.append(self._opt("--ntasks", r.tasks))
        opts.append(self._opt("--time", format_duration(r.walltime_s)))
        if r.signal_before_s:
            opts.append(self._opt("--signal", f"B:USR1@{r.signal_before_s}"))
        if not r.requeue:
            opts.append("--no-requeue")   # hpcrun's retry policy reruns failed work, never Slurm behind its back
        log = "%x-%A_%a.out" if r.array else "%x-%j.out"
        opts.append(self._opt("--output", f"{r.log_dir}/{log}"))
        opts.append(self._opt("--comment", r.comment))
        if r.array:
            opts.append(self._opt("--array", r.array))
        opts += [self._opt(k, v) for k, v in r.runtime_options]
        for extra in r.extra:
            key, sep, value = extra.partition("=")
            opts.append(self._opt(key, value if sep else None))
        return opts

    def launch_options(self, nodes: str, tasks: str, per_node: str, *, overcommit: bool = False,
                       step: bool = True) -> List[str]:
        words = ["--overlap"] if step else []
        words += [f"--nodes={nodes}", f"--ntasks={tasks}", f"--ntasks-per-node={per_node}"]
        if overcommit:
            words.append("--overcommit")
        if step:
            words.append("--kill-on-bad-exit=0")
        return words

    def extra_problem(self, option: str) -> str:
        name = option.split("=", 1)[0]
        if not option.startswith("--") or " " in name:
            return f"'{option}' is not a long sbatch option; write it as --name=value"
        if '"' in option:
            return f"'{option}' contains a double quote, which cannot be written into an #SBATCH line"
        # sbatch accepts unambiguous abbreviations (--tim= is --time=)
        managed = [m for m in MANAGED if m == name or (len(name) > 3 and m.startswith(name))]
        if managed:
            return (f"'{managed[0]}' is written by hpcrun from {MANAGED[managed[0]]}; "
                    "set it there so that it is checked against the site profile")
        return ""

    def job_identity(self, array: bool) -> List[str]:
        lines = ["export HPCRUN_JOB_ID=${SLURM_JOB_ID:-}", "export HPCRUN_NODES=${SLURM_JOB_NUM_NODES:-1}"]
        if array:
            lines.append("export HPCRUN_ARRAY_INDEX=${SLURM_ARRAY_TASK_ID:?this script is a job array}")
        return lines

    def task_identity(self) -> List[str]:
        return ["export HPCRUN_RANK=${SLURM_PROCID:?run me under srun}",
                "export HPCRUN_NRANKS=${SLURM_NTASKS:?run me under srun}", *self.node_identity()]

    def node_identity(self) -> List[str]:
        return ["export HPCRUN_NODE=${SLURMD_NODENAME:-$(hostname)}"]

    def template_context(self, options: Sequence[str]) -> Dict[str, object]:
        return {"sbatch_options": options}

    def submit(self, script: Path, *, name: str, array: Optional[str] = None, dependency: str = "",
               adjust: Optional[Adjust] = None) -> str:
        extra = [f"--job-name={name}"]
        if array:
            extra.append(f"--array={array}")
        if dependency:
            extra.append(f"--dependency={dependency}")
        return sbatch(script, extra + adjust_options(adjust))

    def cancel(self, job_ids: Sequence[str]) -> None:
        proc = _run(["scancel", *job_ids])
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr and "already complet" not in proc.stderr:
            raise SlurmError(f"scancel failed: {proc.stderr.strip()}")

    def dependency(self, kind: str, job_ids: Sequence[str]) -> str:
        return f"after{kind}:" + ":".join(job_ids) if job_ids else ""

    def records(self, job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                known: Optional[Mapping[str, str]] = None) -> Dict[str, Record]:
        return sacct_records(job_ids, since, names=names, known=known)

    def queue(self, *, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
              expand: bool = True, ended: bool = False) -> List[Queued]:
        return squeue_jobs(job_ids=job_ids, names=names, user=user, expand=expand, ended=ended)

    def since_text(self, moment: _dt.datetime) -> str:
        return since_text(moment)

    def parse_time(self, text: Optional[str]) -> Optional[_dt.datetime]:
        return parse_time(text)

    def state_of(self, job_id: str) -> Optional[str]:
        rows = sacct([job_id])
        return rows[0].state if rows else None

    def submit_command(self, script: str) -> str:
        return f"sbatch {script}"

    def job_env(self) -> Optional[str]:
        return os.environ.get("SLURM_JOB_ID") or None
