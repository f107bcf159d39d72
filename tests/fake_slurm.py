"""Fake sbatch/squeue/sacct on PATH that keep Slurm's view in files.

``queue`` holds what squeue shows (``id|array id|name|state|reason``) and ``acct`` sacct lines
in ACCT_FIELDS order. sbatch appends what it submits to ``queue`` and its argv to ``args``;
a test ends jobs by moving them from ``queue`` to ``acct``. ``stop("slurmdbd")`` makes sacct
fail as it does with slurmdbd down, ``stop("slurmctld")`` makes sbatch, squeue and scancel
fail as they do with the controller down (``start`` undoes either). The real cluster runs in
tests/cluster/.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

FAKE_SBATCH = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmctld-down")):
    sys.stderr.write(os.path.basename(sys.argv[0]) + ": error: Unable to contact slurm controller (connect failure)\n")
    sys.exit(1)
args = sys.argv[1:]
with open(os.path.join(here, "args"), "a") as f:
    f.write(" ".join(args) + "\n")
name = next(a.split("=", 1)[1] for a in args if a.startswith("--job-name="))
if os.environ.get("FAKE_SBATCH_FAIL_FINALIZE") and name.endswith(".finalize"):
    sys.stderr.write(os.environ["FAKE_SBATCH_FAIL_FINALIZE"] + "\n")
    sys.exit(1)
counter = os.path.join(here, "n")
n = int(open(counter).read()) if os.path.exists(counter) else 100
open(counter, "w").write(str(n + 1))
array = next((a.split("=", 1)[1] for a in args if a.startswith("--array=")), None)
if not [a for a in args if not a.startswith("-")]:   # no script file: the script is on standard input
    with open(os.path.join(here, f"stdin-{n}"), "w") as f:
        f.write(sys.stdin.read())
with open(os.path.join(here, "queue"), "a") as f:
    if array:
        f.write(f"{n}_[{array}]|{n}|{name}|PENDING|(None)\n")
    else:
        f.write(f"{n}|{n}|{name}|PENDING|(Dependency)\n")
print(f"{n};cluster")
'''

FAKE_SQUEUE = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmctld-down")):
    sys.stderr.write(os.path.basename(sys.argv[0]) + ": error: Unable to contact slurm controller (connect failure)\n")
    sys.exit(1)
argv = sys.argv[1:]
def opt(name):
    return argv[argv.index(name) + 1].split(",") if name in argv else None
ids, names = opt("-j"), opt("--name")
with open(os.path.join(here, "squeue-calls"), "a") as f:
    f.write(" ".join(argv) + "\n")
rows = open(os.path.join(here, "queue")).read().splitlines() if os.path.exists(os.path.join(here, "queue")) else []
if "--states=all" in argv and os.path.exists(os.path.join(here, "ended")):   # ended within MinJobAge
    rows += open(os.path.join(here, "ended")).read().splitlines()
for row in rows:
    jid, aid, name, state, reason = row.split("|")
    if ids is not None and aid not in ids and jid not in ids:
        continue
    if names is not None and name not in names:
        continue
    print(row)
'''

FAKE_SACCT = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmdbd-down")):
    sys.stderr.write("sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to "
                     "host:localhost:6819: Connection refused\nsacct: error: Sending PersistInit msg: Connection "
                     "refused\nsacct: error: Problem talking to the database: Connection refused\n")
    sys.exit(1)
argv = sys.argv[1:]
def opt(name):
    return argv[argv.index(name) + 1].split(",") if name in argv else None
ids, names = opt("-j"), opt("--name")
rows = open(os.path.join(here, "acct")).read().splitlines() if os.path.exists(os.path.join(here, "acct")) else []
for row in rows:
    parts = row.split("|")
    if ids is not None and parts[0].split("_")[0] not in ids:
        continue
    if names is not None and parts[2] not in names:
        continue
    print(row)
'''


FAKE_SCANCEL = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmctld-down")):
    sys.stderr.write(os.path.basename(sys.argv[0]) + ": error: Unable to contact slurm controller (connect failure)\n")
    sys.exit(1)
with open(os.path.join(here, "scancel-calls"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
'''


FAKE_SCONTROL = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmctld-down")):
    sys.stderr.write("scontrol: error: Unable to contact slurm controller (connect failure)\n")
    print("Slurmctld(primary) at fake is DOWN")
    sys.exit(1)
print("Slurmctld(primary) at fake is UP")
'''

FAKE_SACCTMGR = r'''#!/usr/bin/env python3
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
if os.path.exists(os.path.join(here, "slurmdbd-down")):
    sys.stderr.write("sacctmgr: error: Problem talking to the database: Connection refused\n")
    sys.exit(1)
sys.stderr.write("sacctmgr: error: a stand-in: it knows no clusters\n")   # as the real one without a cluster
sys.exit(1)
'''


class FakeSlurm:
    def __init__(self, root: Path):
        self.bin = root / "fake-slurm"
        self.bin.mkdir()
        for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE), ("sacct", FAKE_SACCT),
                           ("scancel", FAKE_SCANCEL), ("scontrol", FAKE_SCONTROL), ("sacctmgr", FAKE_SACCTMGR)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    def args(self) -> List[str]:
        path = self.bin / "args"
        return path.read_text().splitlines() if path.exists() else []

    def queue(self) -> List[str]:
        path = self.bin / "queue"
        return path.read_text().splitlines() if path.exists() else []

    def end(self, job_id: str, state: str = "COMPLETED", exit_code: str = "0:0", reason: str = "None",
            elapsed_s: int = 0, accounted: bool = True, recent: bool = False) -> None:
        """The job leaves the queue and gets an accounting record, unless not ``accounted`` yet (slurmdbd behind
        the controller); ``recent``: it ended within MinJobAge, so ``squeue --states=all`` still shows it (else
        it is gone from every squeue, as long after its end). It ran ``elapsed_s`` (default 5 s, or a day for a
        TIMEOUT: a job that reaches its time limit ran all of it)."""
        elapsed_s = elapsed_s or (86400 if state == "TIMEOUT" else 5)
        kept, gone = [], []
        for row in self.queue():
            (gone if row.split("|")[1] == job_id else kept).append(row)
        assert gone, f"job {job_id} is not queued"
        (self.bin / "queue").write_text("".join(r + "\n" for r in kept))
        if recent:
            with open(self.bin / "ended", "a") as f:
                f.write("".join("|".join(row.split("|")[:3] + [state, reason]) + "\n" for row in gone))
        with open(self.bin / ("acct" if accounted else "unaccounted"), "a") as f:
            for row in gone:
                jid, _aid, name, _state, _reason = row.split("|")
                f.write(f"{jid}|{jid}|{name}|{state}|{exit_code}|{reason}|{elapsed_s}|00:00:01|1|node1|"
                        f"2030-01-01T00:00:00|2030-01-01T00:00:05|2G|1G\n")

    def catch_up(self) -> None:
        """slurmdbd gets the records the controller kept (the jobs ended with ``accounted=False``)."""
        late = self.bin / "unaccounted"
        if late.exists():
            with open(self.bin / "acct", "a") as f:
                f.write(late.read_text())
            late.unlink()

    def stop(self, daemon: str) -> None:
        """``slurmctld`` or ``slurmdbd`` stops answering."""
        (self.bin / f"{daemon}-down").write_text("")

    def start(self, daemon: str) -> None:
        (self.bin / f"{daemon}-down").unlink()

    def finalize_calls(self, campaign: str) -> List[str]:
        return [a for a in self.args() if f"--job-name={campaign}.finalize" in a]
