"""A claim's inputs run without bash (issue 55): the worker the pilot's agent starts in place of the job script's bash
where the script carries a recipe (``# hpcrun-direct: <json>``, written by render/direct.py).

Standard library only; shipped as the plan's ``bin/hpcrun_late_direct.py`` beside the agent. It speaks the claim's
protocol of the job script (runs.py, templates/_shell.j2 ``claim_loop``) and does for each input what the script's
input does, without a shell: the same directories, run records (the chain's log and timeline, ``chains.tsv``,
``exit_code``, ``reason``), log lines and exit codes (3 setup, 7 chain failed, 10 time limit, 14 chain killed, 143
cancelled). The program is started with posix_spawn, leading a process group of its own, so the agent's cancel and
time limit reach it as they reached the script's input; the time limit's warning comes to this worker, which stops
the program (TERM) and fails the input with 10, as the script's trap did. One program per input and no other
process: a fork of the claim's bash and one of the input's cost about 6 ms of CPU an input on the test cluster.
"""

from __future__ import annotations

import errno
import marshal
import os
import sys
import time

MYPY = False
if MYPY:   # typing costs a worker about 15 ms of CPU to import, and annotations are not evaluated here
    from typing import Dict, List, Optional, Tuple

try:   # the C module alone: signal.py's enums cost a claim's worker about 10 ms of CPU to import (issue 55)
    import _signal as signal
except ImportError:   # pragma: no cover - every CPython has it
    import signal  # type: ignore[no-redef]

DIRECT_MARK = "# hpcrun-direct: "   # a job script's recipe line (render/direct.py writes it)
WORKER = "hpcrun_late_direct.py"   # this file as the plan ships it, in bin/ beside the agent (plan/job/pilots.py)
RECIPE_ENV = "HPCRUN_DIRECT_RECIPE"   # the recipe as the agent read it (marshal, hex): no JSON parsed per claim
EXIT_SETUP, EXIT_CHAIN, EXIT_TIMEOUT, EXIT_CHAIN_KILLED, EXIT_CANCELLED = 3, 7, 10, 14, 143
STOP_WAIT_S = 30.0   # after the time limit's warning or a cancel, the program's TERM is waited for this long
TERM_WAIT_S = 10.0   # this worker TERMed: its program's TERM waited for this long (the agent waits 15 s for both)
SPAWN_RETRY_S = (1, 2, 4, 8)   # a start the node refused for want of processes or memory, tried again (as bash's fork)
# what a program must not inherit from this Python, which ignores SIGPIPE and SIGXFSZ (exec resets handled ones); the
# rest as the pilot left them (SIGINT, SIGQUIT ignored: its agent runs in the background), as the script's inputs have
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
HANDLED = {signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM}   # held while a program starts


def _runs():  # type: ignore[no-untyped-def]
    """runs.py, imported only where an input needs it (its rows not sent, its outputs summed here): it costs a
    worker about 70 ms of CPU to import."""
    if __package__:
        from hpcrun.backends.late import runs
        return runs
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hpcrun_late_runs  # type: ignore[import-not-found]
    return hpcrun_late_runs


def group(pid: int, sig: int, alone: bool = True) -> None:
    """A process group (a program, or an input's script and its chains, or a claim's script), or, if that is gone
    and ``alone`` (the process is known to be the one meant: not reaped), the process alone."""
    if pid <= 0:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        if alone:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def alive(pid: int) -> bool:
    if pid <= 0:   # no process yet (a direct run's program not started): kill(0) would name our own group
        return False
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def script_head(script: str) -> str:
    """A job script's first lines, where its plan directory and its recipe are ("" if it cannot be read)."""
    try:
        with open(script, errors="replace") as f:
            return f.read(16384)
    except OSError:
        return ""


def recipe(script: str) -> Optional[dict]:
    """The recipe a job script carries, or None (none there, or one this worker does not know)."""
    for line in script_head(script).splitlines():
        if line.startswith(DIRECT_MARK):
            import json
            try:
                body = json.loads(line[len(DIRECT_MARK):])
            except ValueError:
                return None
            return body if isinstance(body, dict) and body.get("v") == 1 else None
    return None


def handed(script: str) -> Optional[dict]:
    """The recipe the agent handed over (``RECIPE_ENV``, removed from what the programs inherit), else the script's."""
    text = os.environ.pop(RECIPE_ENV, "")
    try:
        body = marshal.loads(bytes.fromhex(text)) if text else None
    except (ValueError, EOFError, TypeError):
        body = None
    return body if isinstance(body, dict) and body.get("v") == 1 else recipe(script)


def words(argv: List[List[str]], env: Dict[str, str]) -> Tuple[List[str], str]:
    """The program's words from the recipe's pieces (``=text``, ``$NAME``), and the first name unset ("": none)."""
    out = []
    for pieces in argv:
        word = ""
        for piece in pieces:
            if piece.startswith("$"):
                if piece[1:] not in env:
                    return [], piece[1:]
                word += env[piece[1:]]
            else:
                word += piece[1:]
        out.append(word)
    return out, ""


def rows_of(plan: str, index: int) -> str:
    """A job's rows of the plan's tasks.tsv: where tasks.idx says they start, else found by a scan (as the script's
    ``task_rows``); "" if there are none."""
    rows = _runs().TaskTable().rows(plan, index)
    if rows:
        return rows
    key = f"{index}\t"
    try:
        with open(f"{plan}/tasks.tsv", errors="replace") as f:
            return "".join(line for line in f if line.startswith(key))
    except OSError:
        return ""


def which(name: str, path: str) -> str:
    """Where the shell would find a program named without a slash: the first executable file on ``path``."""
    for d in path.split(os.pathsep):
        full = os.path.join(d or ".", name)
        if os.path.isfile(full) and os.access(full, os.X_OK):
            return full
    return ""


def write(fd: int, text: str) -> None:
    """A line for a log, if it can be written (a full disk loses the line, not the input)."""
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def appending(path: str) -> int:
    """A file opened to append (as the shell's ``>>``), or -1 where it cannot be (``write`` then drops the lines)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError:
        return -1


def status_code(status: int) -> int:
    """A wait status as the shell says it: the exit status, or 128 + the signal."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class Claim:
    """One claim's inputs, as the job script's claim loop runs them."""

    def __init__(self, rec: dict, feed: int) -> None:
        self.rec, self.feed = rec, feed
        self.env = dict(os.environ)
        self.env.update({k: v for k, v in rec["env"]})
        self.plan = self.env["HPCRUN_PLAN_DIR"]
        # the node's name where the scheduler puts it (its node_identity), else the host's, as hostname(1) says it
        self.node = os.environ.get(rec.get("node_var") or "", "") or os.uname().nodename
        self.killed = set(rec["killed"])   # the model's KILL_SIGNALS, as the renderer wrote them
        self.items: List[Tuple[str, str, str]] = []   # job index, claim id, rows
        self.made: List[bool] = []
        self.started: set = set()
        self.sums = False
        self.pid = 0               # the program running now
        self.n = -1                # the input running now (its place in the claim)
        self.cid = ""
        self.rundir = ""           # the running input's run directory, once known ("": no record is written)
        self.warned = False        # the time limit's warning came: the input fails with 10
        self.cancelled = False     # the agent cancels the running input (SIGUSR2 before its TERM to the program)

    # -- the protocol ------------------------------------------------------------------------------------------
    def tell(self, text: str) -> None:
        os.write(self.feed, text.encode())

    def log(self, *texts: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write(2, "".join(f"{stamp} hpcrun[{self.cid or 'local'}]: {t}\n" for t in texts))   # a full disk: lost

    def read_items(self, feed_in) -> List[str]:  # type: ignore[no-untyped-def]
        """The claim's inputs (``item`` lines and their rows), up to the first other line (returned, split)."""
        while True:
            f = feed_in.readline().decode(errors="replace").rstrip("\n").split("\t")
            if f[0] != "item" or len(f) < 5 or not f[4].isdigit():
                return f
            rows = "".join(feed_in.readline().decode(errors="replace") for _ in range(int(f[4])))
            self.items.append((f[2], f[3], rows.rstrip("\n")))

    def make_dirs(self) -> None:
        """Every input's directories at once (its run and chains directories, its claim's outputs directory)."""
        dirs = [d for idx, cid, rows in self.items if rows for d in self._dirs(rows, cid)]
        try:
            for d in dirs:
                os.makedirs(d, exist_ok=True)
            self.made = [bool(rows) for _, _, rows in self.items]
        except OSError:   # each input makes its own, and fails on its own if it cannot
            self.made = [False] * len(self.items)

    def _dirs(self, rows: str, cid: str) -> List[str]:
        job = rows.split("\t")[1] if "\t" in rows else ""
        return [f"{self.plan}/run/{job}/{cid}/chains", f"{self.rec['outdir']}/{cid}"]

    def tidy(self) -> None:
        """The directories made for inputs never told to start (sent back to the queue), their jobs' if empty."""
        for n, (_, cid, rows) in enumerate(self.items):
            if n in self.started or n >= len(self.made) or not self.made[n]:
                continue
            chains, out = self._dirs(rows, cid)
            for d in (chains, os.path.dirname(chains), os.path.dirname(os.path.dirname(chains)), out):
                try:
                    os.rmdir(d)
                except OSError:
                    pass

    # -- signals -------------------------------------------------------------------------------------------------
    def on_warning(self, *_: object) -> None:
        """The time limit's warning: the program stopped (TERM; KILLed if it runs on STOP_WAIT_S later, as its
        input's end must not leave it writing), and the input fails with 10 once it ended (unless cancelled)."""
        if self.warned or self.cancelled:
            return
        self.warned = True
        self.log("pre-timeout signal received: stopping chains and database servers cleanly")
        self.stop_program()

    def on_alarm(self, *_: object) -> None:
        if self.warned or self.cancelled:
            group(self.pid, signal.SIGKILL, False)

    def on_cancel(self, *_: object) -> None:
        """The agent cancels the running input (an operator's cancel), which it TERMs too: TERMed here as well (a
        program started since the agent looked), KILLed if it runs on STOP_WAIT_S later, ended 143."""
        if not self.cancelled and self.cid:
            self.cancelled = True
            self.stop_program()

    def stop_program(self) -> None:
        """The program TERMed, and KILLed by the alarm (on_alarm) if it runs on STOP_WAIT_S later."""
        group(self.pid, signal.SIGTERM, False)
        signal.alarm(int(STOP_WAIT_S))

    def on_term(self, *_: object) -> None:
        """The pilot stops this run (or the agent its input, at the limit after the warning): the program TERMed
        and KILLed if it runs on TERM_WAIT_S later, so that none writes on unseen; the input ended (143, 10 after
        the warning); the directories of those never started removed."""
        if self.pid:
            group(self.pid, signal.SIGTERM, False)
            self.reap(TERM_WAIT_S)
            group(self.pid, signal.SIGKILL, False)   # what is left of its group
            self.running(0)
        code, why = (EXIT_TIMEOUT, "time limit reached before the job finished") if self.warned else \
            (EXIT_CANCELLED, "job was cancelled (SIGTERM)")
        if self.cid:
            self.fail(code, why)
            self.finish(code)
        self.tidy()
        os._exit(code)

    def reap(self, wait_s: float) -> None:   # the program waited for, up to wait_s
        for _ in range(int(wait_s * 10)):
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(0.1)

    # -- one input -------------------------------------------------------------------------------------------------
    def fail(self, code: int, why: str) -> int:
        self.log(f"FAILED: {why}")
        try:
            if not self.rundir:
                return code
            with open(f"{self.rundir}/reason", "w") as f:
                f.write(why + "\n")
        except OSError:
            pass
        return code

    def finish(self, rc: int) -> None:
        try:
            if self.rundir:
                with open(f"{self.rundir}/exit_code", "w") as f:
                    f.write(f"{rc}\n")
        except OSError:
            pass
        self.log(f"job finished with exit code {rc}")

    def run(self, n: int) -> None:
        """Input ``n`` run to its end, its ``begin`` and ``end`` told to the agent."""
        idx, cid, rows = self.items[n]
        self.started.add(n)
        signal.alarm(0)   # a warning meant for the input before (sent as it ended) stops nothing of this one
        self.cid, self.n, self.warned, self.cancelled, self.pid, self.rundir = cid, n, False, False, 0, ""
        # begun at once, as the script's input right after its fork: from here the agent limits it (the worker
        # itself if no program started, stuck on a filesystem) and a worker's death fails it, counted
        self.tell(f"begin\t{n}\t0\t{time.time():.6f}\t{os.getpid()}\n")
        try:
            rc, cpu = self.input(n, idx, cid, rows)
        except Exception as e:   # whatever went wrong here fails the input, counted (never back to the queue)
            group(self.pid, signal.SIGKILL, False)
            rc, cpu = self.fail(1, f"the pilot's worker failed: {e!r}"), 0.0
        self.finish(rc)
        self.tell(f"end\t{n}\t{rc}\t{time.time():.6f}\t{cpu:.3f}\n")
        self.cid, self.pid = "", 0

    def input(self, n: int, idx: str, cid: str, rows: str) -> Tuple[int, float]:
        if not rows:   # the agent could not read them: found here, as the script's task_rows would
            rows = rows_of(self.plan, int(self.rec.get("tasks_base", 0)) + int(idx)).rstrip("\n")
        fields = [r.split("\t") for r in rows.splitlines() if r]
        env = dict(self.env, HPCRUN_JOB_ID=cid, HPCRUN_CLAIM_ID=cid, HPCRUN_ARRAY_INDEX=idx, HPCRUN_CLAIM_INDEX=idx)
        env.pop("HPCRUN_AGENT_SUMS", None)
        if self.sums and self.items[n][2]:
            env["HPCRUN_AGENT_SUMS"] = "1"
        if not fields or len(fields[0]) < 7:
            self.log(f"no task {idx} in {self.plan}/tasks.tsv")
            return EXIT_SETUP, 0.0
        job, chains = fields[0][1], fields[0][2]
        self.rundir = rundir = f"{self.plan}/run/{job}/{cid}"
        outdir = f"{self.rec['outdir']}/{cid}"
        env.update(HPCRUN_JOB=job, HPCRUN_CHAINS_PER_NODE=chains, HPCRUN_NCHAINS=chains, HPCRUN_RUNDIR=rundir,
                   HPCRUN_INPUT_DIR="", HPCRUN_WORKDIR=f"{self.rec['workdir']}/{job}/{cid}", HPCRUN_OUTDIR=outdir)
        self.log(f"job {job}: {len(fields)} input(s), {chains} chain(s) on 1 node(s), release "
                 f"{env.get('HPCRUN_RELEASE') or '(none)'}, generation {self.rec.get('generation', 1)}")
        try:
            if not self.made[n]:
                for d in (outdir, f"{rundir}/chains"):
                    os.makedirs(d, exist_ok=True)
        except OSError as e:   # as the script's mkdir under set -e: its status, 1 (retried as a passing fault)
            self.log(f"mkdir: cannot create directory {e.filename}: {e.strerror}")
            return 1, 0.0
        if chains != "1" or len(fields) != 1:
            return self.fail(EXIT_SETUP, "a direct run has one chain and one input: plan it again"), 0.0
        _index, _name, _chains, path, events, stem, output = fields[0][:7]
        if not os.access(path, os.R_OK):
            return self.fail(EXIT_SETUP, f"input {path} is missing or unreadable"), 0.0
        self.log("starting 1 chain(s)")
        env.update(HPCRUN_TASK_RANK="0", HPCRUN_TASK_COUNT="1", HPCRUN_RANK="0", HPCRUN_NRANKS="1",
                   HPCRUN_NODE=self.node, HPCRUN_CHAIN="0", HPCRUN_NCHAINS="1")
        env.update({k: v for k, v in self.rec["chain_env"]})
        env.update(HPCRUN_STEM=stem, HPCRUN_INPUT=path, HPCRUN_OUTPUT=f"{outdir}/{output}")
        for name in ("HPCRUN_FIRST_EVENT", "HPCRUN_NEVENTS", "HPCRUN_LAST_EVENT"):
            env.pop(name, None)
        if events != "-" and events.isdigit():
            env.update(HPCRUN_FIRST_EVENT="0", HPCRUN_NEVENTS=events, HPCRUN_LAST_EVENT=str(int(events) - 1))
        step, cpu = self.chain(env, rundir, stem)
        return self.verdict(step, env, outdir, output), cpu

    def chain(self, env: Dict[str, str], rundir: str, stem: str) -> Tuple[int, float]:
        """The chain's one program, its timeline and log as the chain script keeps them: its status and CPU. A
        timeline that cannot be written is none (the script's goes to /dev/null); a log that cannot be opened
        fails the program's start (the script's redirection: status 1)."""
        log = appending(f"{rundir}/chains/0.log")
        if log < 0:
            return 1, 0.0
        timeline = appending(f"{rundir}/chains/0.timeline")
        try:
            write(timeline, f"start {time.time():.6f} {self.node}\nbegin {time.time():.6f} {stem}\n")
            step, cpu = self.program(env, log)
            write(timeline, f"end {time.time():.6f} {stem} {step}\nstop {time.time():.6f} {step}\n")
            if step != 0 and not self.warned:
                write(log, f"chain 0 failed on {stem} with exit code {step}\n")
            return step, cpu
        finally:
            for fd in (log, timeline):
                if fd >= 0:
                    os.close(fd)

    def program(self, env: Dict[str, str], log: int) -> Tuple[int, float]:
        """The program run to its end: its status and CPU. Started with the signals held, so that a handler finds
        its pid known, here and by the agent (told before a TERM may end this worker), or finds it never started."""
        argv, unset = words(self.rec["argv"], env)
        if unset:
            write(log, f"hpcrun: {unset}: unbound variable\n")
            return 1, 0.0
        for wait in (*SPAWN_RETRY_S, 0):
            signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
            try:
                if self.warned or self.cancelled:   # the warning or the cancel came before it started: it does not
                    return 143, 0.0
                pid = self.spawn(argv, env, log, bool(wait))
                if pid > 0:
                    self.running(pid)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
            if pid:
                break
            time.sleep(wait)   # a signal's handler runs meanwhile; its flag is looked at before the next try
        if pid < 0:
            return -pid, 0.0
        _, status, usage = os.wait4(pid, 0)   # a signal's handler runs, and the wait goes on (PEP 475)
        signal.alarm(0)
        self.running(0)   # none runs now: the agent's limit stops this worker if it is stuck after
        return status_code(status), usage.ru_utime + usage.ru_stime

    def running(self, pid: int) -> None:
        """The program running now (0: none), told to the agent, which signals the group it names."""
        self.pid = pid
        write(self.feed, f"pid\t{self.n}\t{pid}\n")

    def spawn(self, argv: List[str], env: Dict[str, str], log: int, again: bool = False) -> int:
        """The program started, leading a process group of its own; -status where it could not (127 not found, 126
        not executable, as the shell says; why in its log); 0 if ``again`` and the node lacks processes or memory."""
        path = argv[0] if "/" in argv[0] else which(argv[0], env.get("PATH", os.defpath))
        if not path:
            write(log, f"hpcrun: {argv[0]}: command not found\n")
            return -127
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, log, 1),
                   (os.POSIX_SPAWN_DUP2, log, 2)]
        for args in ((path, argv), ("/bin/bash", ["/bin/bash", path, *argv[1:]])):   # a script without #!: bash
            try:
                return os.posix_spawn(args[0], args[1], env, file_actions=actions, setpgroup=0,  # type: ignore
                                      setsigdef=DEFAULT_SIGNALS, setsigmask=())
            except OSError as e:
                if again and e.errno in (errno.EAGAIN, errno.ENOMEM):
                    write(log, f"hpcrun: fork: retry: {e.strerror}\n")
                    return 0
                if e.errno != errno.ENOEXEC:
                    write(log, f"hpcrun: {argv[0]}: {e.strerror}\n")
                    return -(127 if e.errno == errno.ENOENT else 126)
        return -126

    def verdict(self, step: int, env: Dict[str, str], outdir: str, output: str) -> int:
        """The input's exit code from its chain's status, as the job script decides it (its chains block)."""
        rundir = env["HPCRUN_RUNDIR"]
        if self.warned:
            return self.fail(EXIT_TIMEOUT, "time limit reached before the job finished")
        if self.cancelled:   # the agent's cancel: TERM to the input's group, which the script's shell was in
            return self.fail(EXIT_CANCELLED, "job was cancelled (SIGTERM)")
        ending = "ok" if step == 0 else "killed" if step in self.killed else "crashed" if step > 128 else "failed"
        with open(f"{rundir}/chains.tsv", "a") as f:
            f.write(f"0\t{step}\t{ending}\n")
        if ending in ("failed", "crashed"):
            return self.fail(EXIT_CHAIN, f"chain(s) failed: 0(rc={step}); logs in {rundir}/chains")
        if ending == "killed":
            return self.fail(EXIT_CHAIN_KILLED, f"chain(s) killed by a signal: 0(rc={step}); logs in {rundir}/chains")
        self.log("all 1 chain(s) succeeded")
        if "HPCRUN_AGENT_SUMS" not in env:   # the agent does not sum them: summed here (no program per output)
            text, errors = _runs().outputs_tsv([output], outdir, self.rec["algo"])
            with open(f"{rundir}/outputs.tsv", "w") as f:
                f.write(text)
            if errors:
                with open(f"{rundir}/checksums.log", "a") as f:
                    f.write(errors)
        self.log("all steps succeeded")
        return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    script = args[0] if args else ""
    rec = handed(script)
    if rec is None:   # no recipe this worker knows: the script's own bash runs the claim
        os.execvp("bash", ["bash", script])
    feed = int(os.environ["HPCRUN_CLAIM_FEED"])
    os.set_inheritable(feed, False)
    os.umask(0o022)
    claim = Claim(rec, feed)
    signal.signal(signal.SIGUSR1, claim.on_warning)
    signal.signal(signal.SIGUSR2, claim.on_cancel)
    signal.signal(signal.SIGALRM, claim.on_alarm)
    signal.signal(signal.SIGTERM, claim.on_term)
    feed_in = sys.stdin.buffer
    said = claim.read_items(feed_in)
    claim.make_dirs()
    if said[:2] == ["ready", "sums"] and rec["algo"] in (said[2] if len(said) > 2 else "").split(","):
        claim.sums = True
        claim.tell(f"sums\t{rec['algo']}\t{rec['outdir']}\n")
    while True:
        f = feed_in.readline().decode(errors="replace").rstrip("\n").split("\t")
        if f[0] != "go" or len(f) < 2 or not f[1].isdigit() or int(f[1]) >= len(claim.items):
            break
        claim.run(int(f[1]))
    claim.tidy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
