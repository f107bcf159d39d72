"""Slurm's commands, run: one at a time per process, timed, transient errors retried with backoff, and
each failure turned into the neutral error it means (not configured, controller or accounting away).

Kept apart from slurm.py (what the commands say) because it is how hpcrun treats the site's
scheduler (issue 46): a throttled libslurm retries silently, so a command that slows down is noted in
the process's pace, and the supervisor lengthens its interval instead of piling up timeouts.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from hpcrun.backends.scheduler.base import (
    PACE,
    AccountingUnreachable,
    SchedulerError,
    SubmitUncertain,
    Unreachable,
)

TRANSIENT = ("Socket timed out", "Unable to contact slurm controller", "Slurm temporarily unable",
             "Resource temporarily unavailable", "Connection refused", "Zero Bytes were transmitted or received")
# for sbatch only errors that prove the controller never took the job: after a timeout the job
# may exist, and submitting again would duplicate it
NOT_REACHED = ("Unable to contact slurm controller", "Connection refused")
# -M NAME of a cluster slurmdbd knows but whose controller is down (deregistered): definite at once
CLUSTER_DOWN = "can't be reached now"
# the commands that talk to slurmdbd alone: a connection they cannot open is accounting's, not the
# controller's (seen with slurmdbd stopped: "Problem talking to the database: Connection refused")
ACCOUNTING_COMMANDS = ("sacct", "sacctmgr", "sreport")
DBD_DOWN = ("Problem talking to the database", "persistent connection", "slurmdbd", "Connection refused",
            "Socket timed out")
# libslurm found no configuration: neither slurm.conf nor SLURM_CONF nor configless mode's DNS SRV record
NO_CONFIG = ("_establish_config_source", "resolve_ctls_from_dns_srv", "fetch_config: DNS SRV lookup failed")
NOT_CONFIGURED = ("Slurm's commands are installed here, but no controller is configured (no slurm.conf, "
                  "SLURM_CONF unset, no DNS SRV record for slurmctld)")
# a query (not sbatch: its timeout may have submitted) that still times out after the retries
TIMED_OUT = ("Socket timed out", "timed out after", "Zero Bytes were transmitted or received")


class SlurmError(SchedulerError):
    """A Slurm command failed; the message carries its output verbatim."""


class SbatchUncertain(SlurmError, SubmitUncertain):
    """sbatch timed out or lost the controller mid-call: the job may or may not exist."""


class SlurmUnreachable(SlurmError, Unreachable):
    """The cluster's controller did not answer (down, or in the middle of a restart)."""


class SlurmNotConfigured(SlurmUnreachable):
    """Slurm's commands found no controller to ask: no slurm.conf, no SLURM_CONF, no DNS SRV record
    (a laptop, a build host; or a configless site whose DNS does not answer now, hence Unreachable)."""


class SlurmAccountingUnreachable(SlurmError, AccountingUnreachable):
    """slurmdbd did not answer (down, restarting): sacct cannot say what ended; squeue still answers."""


def _env() -> Optional[Dict[str, str]]:
    """The environment for Slurm commands: ours without ``SBATCH_*`` (None: ours as it is, the cheap case)."""
    if not any(k.startswith("SBATCH_") for k in os.environ):
        return None
    return {k: v for k, v in os.environ.items() if not k.startswith("SBATCH_")}


def _run(argv: Sequence[str], retries: int = 3, cwd: Optional[Path] = None,
         transient: Sequence[str] = TRANSIENT, cluster: Optional[str] = None,
         stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run a Slurm command (on ``cluster`` with ``--clusters``), retrying transient controller errors
    with backoff; a controller that still does not answer raises SlurmUnreachable."""
    if cluster:
        argv = [argv[0], f"--clusters={cluster}", *argv[1:]]
    proc = _attempts(argv, retries, cwd, transient, stdin)
    text = proc.stderr.strip() or proc.stdout.strip()
    if proc.returncode == 0:
        return proc
    where = f"cluster {cluster}" if cluster else "the cluster"
    if any(t in text for t in NO_CONFIG):   # one line, not libslurm's three
        raise SlurmNotConfigured(f"{argv[0]}: {NOT_CONFIGURED}", cluster)
    if argv[0] in ACCOUNTING_COMMANDS and (proc.returncode == 124 or any(t in text for t in DBD_DOWN)):
        raise SlurmAccountingUnreachable(f"{argv[0]}: the accounting (slurmdbd) of {where} does not answer: {text}",
                                         cluster)
    if CLUSTER_DOWN in text or any(t in text for t in NOT_REACHED) or (
            argv[0] != "sbatch" and (proc.returncode == 124 or any(t in text for t in TIMED_OUT))):
        raise SlurmUnreachable(f"{argv[0]}: the controller of {where} does not answer: {text}", cluster)
    return proc


def _attempts(argv: Sequence[str], retries: int, cwd: Optional[Path],
              transient: Sequence[str], stdin: Optional[str] = None) -> subprocess.CompletedProcess:
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            with PACE.command() as answered:   # never two at once; how long an answer took is noted
                proc = subprocess.run(list(argv), capture_output=True, text=True, env=_env(), cwd=cwd,
                                      timeout=PACE.timeout_s, input=stdin)
                if proc.returncode == 0:
                    answered()
        except FileNotFoundError:
            raise SlurmError(f"'{argv[0]}' was not found: is Slurm installed and on PATH?") from None
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} timed out after {PACE.timeout_s:.0f} s")
        if proc.returncode == 0 or not any(t in proc.stderr for t in transient) or attempt == retries:
            return proc
        time.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")
