"""Slurm's accounting text: sacct's fields, times, sizes and memory, parsed into neutral records.

Kept apart from the commands (slurm.py) because it is pure text handling, called for every
job of every poll: its speed matters, its words are Slurm's own.
"""

from __future__ import annotations

import datetime as _dt
import functools
import pwd
import re
from typing import Collection, Dict, List, Mapping, Optional, Set, Tuple

from hpcrun.backends.scheduler.base import TERMINAL, Record, unchanged

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


@functools.lru_cache(maxsize=64)
def canceller(uid: str) -> str:
    """``0`` -> ``cancelled by uid 0 (root)``: the words a failure reason carries."""
    try:
        return f"cancelled by uid {uid} ({pwd.getpwuid(int(uid)).pw_name})"
    except (KeyError, ValueError):
        return f"cancelled by uid {uid}"


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
    mem_memo: Dict[str, Optional[int]] = {}   # MaxRSS texts repeat (sacct prints 3 significant digits)
    oom: Set[str] = set()
    same: Set[str] = set()
    for line in text.splitlines():
        bar = line.find("|")
        dot = line.find(".", 0, bar)
        if dot >= 0:  # a step: 123.batch, 123_4.0 - only its memory (the last field) and an OOM kill matter
            owner = line[:dot]
            if owner in same:
                continue   # a job still as it was: its steps change nothing
            if line.count("|") == width - 1:   # a whole line: its last field is the step's MaxRSS
                mem_text = line[line.rfind("|") + 1:]
                # the usual MaxRSS is whole KiB (14404K): read without the general parser (3 steps a job)
                kib = mem_text[-1:] == "K" and mem_text[:-1].isdecimal()
                mem = int(mem_text[:-1]) << 10 if kib else (
                    mem_memo[mem_text] if mem_text in mem_memo else mem_memo.setdefault(mem_text, parse_mem(mem_text)))
                if mem is not None and mem > rss.get(owner, -1):
                    rss[owner] = mem
            if "|OUT_OF_MEMORY" in line:
                oom.add(owner)
            continue
        head = line.split("|", 4)   # id, raw id, name, state: enough to see that nothing changed
        if len(head) == 5 and known:
            state = head[3].split(" ")[0].rstrip("+")
            if known.get(head[0]) == state and state not in TERMINAL and head[4].count("|") == width - 5:
                jobs[head[0]] = unchanged(state)
                same.add(head[0])
                continue
        parts = line.split("|")
        if len(parts) != width:
            continue
        job_id, raw, name, state, exit_code, reason, elapsed, cpu, alloc, nodes, start, end, req, _rss = parts
        if state.startswith("CANCELLED by "):   # who cancelled it, where the controller recorded it
            reason = canceller(state[len("CANCELLED by "):])
        state = state.split(" ")[0].rstrip("+")
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


def ended_ids(records: Mapping[str, AcctRecord], in_flight: Collection[str]) -> List[str]:
    """The ids whose steps to ask for: jobs of ``in_flight`` that ended in this answer; an array whose
    every task in the answer ended is asked for by its array id (one word for thousands of tasks)."""
    ended: Dict[str, List[str]] = {}
    whole: Dict[str, bool] = {}
    for key, rec in records.items():
        owner, _, task = key.partition("_")
        done = bool(rec.raw_id) and rec.state in TERMINAL   # the shared unchanged record never ended
        if task:
            whole[owner] = whole.get(owner, True) and done
        if done and key in in_flight:
            ended.setdefault(owner, []).append(key)
    out: List[str] = []
    for owner, keys in ended.items():
        out += [owner] if whole.get(owner) else keys
    return out


def fold_steps(records: Dict[str, AcctRecord], stepped: Mapping[str, AcctRecord]) -> None:
    """What the steps query found of ended jobs - the memory high-water mark, an OOM-killed step, and the
    CPU time (sacct -X leaves a job's TotalCPU 0: it is the sum over its steps) - put into the records
    of the allocation query."""
    for key, got in stepped.items():
        rec = records.get(key)
        if rec is None or not rec.raw_id or rec.state not in TERMINAL:
            continue
        if got.cpu_s is not None:
            rec.cpu_s = got.cpu_s
        if got.max_rss_bytes is not None:
            rec.max_rss_bytes = got.max_rss_bytes
        if got.state == "OUT_OF_MEMORY":
            rec.state = got.state
