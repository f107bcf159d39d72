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
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from hpcrun.backends.scheduler import slurm_budget, slurm_describe
from hpcrun.backends.scheduler.base import (
    TERMINAL,
    Adjust,
    Allocation,
    ClusterFacts,
    JobRequest,
    Launch,
    Maintenance,
    Queued,
    Record,
    Scheduler,
    Unreachable,
    register,
)
from hpcrun.backends.scheduler.slurm_acct import (  # parse_*: re-exported, callers use slurm.*
    ACCT_FIELDS,
    AcctRecord,
    ended_ids,
    fold_steps,
    parse_acct,
    parse_cpu_time,
    parse_req_mem,
    parse_time,
    since_text,
)
from hpcrun.backends.scheduler.slurm_run import (  # the errors: re-exported, callers use slurm.*
    NOT_REACHED,
    TRANSIENT,
    SbatchUncertain,
    SlurmAccountingUnreachable,
    SlurmError,
    SlurmNotConfigured,
    SlurmUnreachable,
    _run,
)
from hpcrun.units import format_duration

__all__ = ["SbatchUncertain", "Slurm", "SlurmAccountingUnreachable", "SlurmError", "SlurmNotConfigured",
           "SlurmUnreachable", "parse_acct", "parse_cpu_time", "parse_req_mem", "squeue_jobs"]

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


def _job_name(options: Sequence[str]) -> str:
    return next((o.partition("=")[2] for o in options if o.startswith("--job-name=")), "the job")


def sbatch(script: Path, extra: Sequence[str] = (), text: Optional[str] = None) -> str:
    """Submit a script (``text`` on standard input, else the file); return its job id. sbatch's
    rejection is shown verbatim.

    Raises SbatchUncertain when the outcome is unknown (timeout, controller lost after the
    request went out): the caller must look for the job under its tag before trying again.
    """
    argv = ["sbatch", "--parsable", *extra] + ([] if text is not None else [str(script)])
    proc = _run(argv, cwd=script.parent, transient=NOT_REACHED, stdin=text)
    what = str(script) if text is None else f"{script} (filled for {_job_name(extra)}, on standard input)"
    if proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip()
        if proc.returncode == 124 or (any(t in said for t in TRANSIENT) and not any(t in said for t in NOT_REACHED)):
            raise SbatchUncertain(f"sbatch of {what} did not finish cleanly; the job may exist:\n{said}")
        raise SlurmError(f"sbatch rejected {what}:\n{said}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id for {what}: {proc.stdout!r}")
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


def sacct(job_ids: Sequence[str], since: str = "now-30days", cluster: Optional[str] = None) -> List[JobState]:
    """One sacct call for all jobs (allocation rows only)."""
    if not job_ids:
        return []
    proc = _run(["sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-j", ",".join(job_ids),
                 "-o", SACCT_FIELDS.replace("%64", "")], cluster=cluster)
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed: {proc.stderr.strip()}")
    return parse_sacct(proc.stdout)


# ---- campaign-level queries: tags, accounting records, queue size -------------------------

STEP_IDS_PER_CALL = 2000   # ids of ended jobs in one sacct -j (one argument: well below 128 KiB)


def sacct_records(job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                  known: Optional[Mapping[str, str]] = None, cluster: Optional[str] = None,
                  in_flight: Optional[Collection[str]] = None) -> Dict[str, AcctRecord]:
    """One sacct call over these jobs (arrays by their array id) or job names, since ``since``, without
    their steps (``-X``: one line a job however many steps it runs); then, for those of ``in_flight``
    that ended, one call for their steps alone (issue 46: rows independent of the jobs still running)."""
    if not job_ids and not names:
        return {}
    argv = ["sacct", "-X", "-n", "-P", "-S", since, "-E", "now", "-o", ",".join(ACCT_FIELDS)]
    if job_ids:
        argv += ["-j", ",".join(job_ids)]
    if names:
        argv += ["--name", ",".join(names)]
    records = parse_acct(_sacct_text(argv, cluster), known)
    if in_flight:
        ended = ended_ids(records, in_flight)
        for start in range(0, len(ended), STEP_IDS_PER_CALL):
            ids = ",".join(ended[start:start + STEP_IDS_PER_CALL])
            stepped = parse_acct(_sacct_text(["sacct", "-n", "-P", "-S", since, "-E", "now", "-o",
                                              ",".join(ACCT_FIELDS), "-j", ids], cluster))
            fold_steps(records, stepped)
    return records


def _sacct_text(argv: List[str], cluster: Optional[str]) -> str:
    proc = _run(argv, cluster=cluster)
    if proc.returncode != 0:
        raise SlurmError(f"sacct failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


QueuedJob = Queued     # the neutral queue row, filled from squeue (%A gives raw_id)


def squeue_jobs(*, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
                expand: bool = True, ended: bool = False, cluster: Optional[str] = None) -> List[QueuedJob]:
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
    proc = _run(argv, cluster=cluster)
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


def parse_maintenance(text: str) -> List[Maintenance]:
    """``scontrol show reservation --oneliner`` -> the reservations flagged MAINT."""
    out = []
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "MAINT" not in fields.get("Flags", "").split(","):
            continue
        out.append(Maintenance(fields.get("ReservationName", "?"), parse_time(fields.get("StartTime")),
                               parse_time(fields.get("EndTime"))))
    return out


def queued_count(user: str, cluster: Optional[str] = None) -> int:
    """How many jobs and array tasks this user has queued or running (what MaxSubmitJobs counts)."""
    return len(squeue_jobs(user=user, cluster=cluster))


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
    if adjust.nodelist:
        out.append("--nodelist=" + ",".join(adjust.nodelist))
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
    daemons = {"controller": "slurmctld", "accounting": "slurmdbd"}
    directive = "#SBATCH"
    # srun: REQUEST_HET_JOB_ALLOC_INFO and REQUEST_JOB_STEP_CREATE; slurmstepd: REQUEST_STEP_COMPLETE (sdiag)
    launch = Launch(command=("srun",), log_name="srun.log", step_rpcs=2, step_end_rpcs=1)
    # what srun gives every task; a container that clears the environment must pass these on
    task_env = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURMD_NODENAME")
    node_env = "SLURMD_NODENAME"
    task_env_patterns = ("SLURM_*",)
    node_cpus = '"${SLURM_CPUS_ON_NODE:-}"'

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

    def job_logs(self, name: str, job_id: str, array_index: Optional[int]) -> List[str]:
        """The names --output (shared_options) gives a job's log in its log directory, an array task's first."""
        one = f"{name}-{job_id}.out"
        return [f"{name}-{job_id}_{array_index}.out", one] if array_index is not None else [one]

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
               adjust: Optional[Adjust] = None, text: Optional[str] = None) -> str:
        extra = [f"--job-name={name}"] + ([f"--clusters={self.cluster}"] if self.cluster else [])
        if array:
            extra.append(f"--array={array}")
        if dependency:
            extra.append(f"--dependency={dependency}")
        return sbatch(script, extra + adjust_options(adjust), text=text)

    def cancel(self, job_ids: Sequence[str]) -> None:
        proc = _run(["scancel", *job_ids], cluster=self.cluster)
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr and "already complet" not in proc.stderr:
            raise SlurmError(f"scancel failed: {proc.stderr.strip()}")

    def dependency(self, kind: str, job_ids: Sequence[str]) -> str:
        return f"after{kind}:" + ":".join(job_ids) if job_ids else ""

    def records(self, job_ids: Sequence[str], since: str, *, names: Sequence[str] = (),
                known: Optional[Mapping[str, str]] = None,
                in_flight: Optional[Collection[str]] = None) -> Dict[str, Record]:
        return sacct_records(job_ids, since, names=names, known=known, cluster=self.cluster, in_flight=in_flight)

    def queue(self, *, job_ids: Sequence[str] = (), names: Sequence[str] = (), user: Optional[str] = None,
              expand: bool = True, ended: bool = False) -> List[Queued]:
        return squeue_jobs(job_ids=job_ids, names=names, user=user, expand=expand, ended=ended, cluster=self.cluster)

    def since_text(self, moment: _dt.datetime) -> str:
        return since_text(moment)

    def parse_time(self, text: Optional[str]) -> Optional[_dt.datetime]:
        return parse_time(text)

    def state_of(self, job_id: str) -> Optional[str]:
        rows = sacct([job_id], cluster=self.cluster)
        return rows[0].state if rows else None

    def maintenance(self) -> List[Maintenance]:
        proc = _run(["scontrol", "show", "reservation", "--oneliner"], cluster=self.cluster)
        if proc.returncode != 0:
            raise SlurmError(f"scontrol show reservation failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return parse_maintenance(proc.stdout)

    def _output(self, argv: List[str], retries: int = 3, shown: Optional[int] = None) -> str:
        """A query's output (sacctmgr asks slurmdbd: no --clusters); SlurmError naming the command (its
        first ``shown`` words) when it fails."""
        proc = _run(argv, retries=retries, cluster=None if argv[0] == "sacctmgr" else self.cluster)
        if proc.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:shown])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def describe(self) -> ClusterFacts:
        return slurm_describe.describe(self._output, self.cluster)

    def allocation(self, account: Optional[str]) -> Allocation:
        return slurm_budget.allocation(lambda argv: self._output(argv, retries=1, shown=3), account, self.cluster)

    budget_reason = staticmethod(slurm_budget.is_budget_reason)

    def known_clusters(self) -> Optional[List[str]]:
        try:
            proc = _run(["sacctmgr", "--noheader", "--parsable2", "list", "cluster", "format=cluster"], retries=0)
        except SlurmError:
            return None
        if proc.returncode != 0:
            return None
        return [line.strip() for line in proc.stdout.splitlines() if line.strip()]

    def unanswered(self, daemon: str) -> str:
        """Words only when the daemon positively does not answer (any other failure cannot tell)."""
        argv = (["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"] if daemon == "accounting"
                else ["scontrol", "ping"])
        try:
            proc = _run(argv, retries=0, cluster=None if daemon == "accounting" else self.cluster)
        except Unreachable as exc:
            return exc.words()
        except SlurmError:
            return ""
        down = [line for line in proc.stdout.splitlines() if line.rstrip().endswith("is DOWN")]
        return f"scontrol ping: {down[0].strip()}" if daemon != "accounting" and down else ""

    def submit_command(self, script: str) -> str:
        return f"sbatch {script}" if not self.cluster else f"sbatch --clusters={self.cluster} {script}"

    def job_env(self) -> Optional[str]:
        return os.environ.get("SLURM_JOB_ID") or None
