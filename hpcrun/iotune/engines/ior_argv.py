"""Build IOR 4.0 command lines from sweep parameters, and check any IOR argv against IOR 4.0's option grammar.

Grammar facts (IOR 4.0 ``src/option.c`` / ``src/parse_options.c``, ``doc/sphinx/userDoc/options.rst``):

* a short option is ``-x``; one that takes a value accepts ``-t 1m``, ``-t1m`` or ``-t=1m``; a long option
  is ``--name`` / ``--name=value`` / ``--name value``. Flags are **not** bundled: IOR reads only the first
  letter of ``-wr``, so ``-wr`` silently means ``-w``;
* sizes are a whole number with an optional ``k m g t p`` suffix (powers of 1024, case-insensitive);
  anything else is misread (``1.5m`` is 1 byte, ``1MB`` is 1 MiB by accident);
* ``-O key=value[,key=value]`` sets directives; ``summaryFormat`` is ``default``, ``JSON`` or ``CSV``;
* a run fails when the transfer size is 0 or not a multiple of 8, the block size is not a multiple of the
  transfer size, ``-z`` is used with block size = transfer size, or ``-C`` and ``-Z`` are both given;
* ``-v`` with ``summaryFormat=JSON`` produces invalid JSON in 4.0.0, so it is refused here.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from hpcrun.errors import HpcrunError

DEFAULT_TRANSFER = 262144
DEFAULT_BLOCK = 1048576

APIS = ("POSIX", "DUMMY", "MPIIO", "MMAP", "HDF5", "NCMPI", "HDFS", "S3", "S3-4c", "S3-libs3", "RADOS",
        "CEPHFS", "DAOS", "DFS", "IME", "PMDK", "AIO", "Gfarm", "CHFS", "FINCHFS", "LIBNFS", "NC4", "BFS")

# kind: flag | size | count | int | str | api | packet | directive | memory
SHORT: Dict[str, Tuple[str, str]] = {
    "a": ("api", "api"), "A": ("int", "refNum"), "b": ("size", "blockSize"), "c": ("flag", "collective"),
    "C": ("flag", "reorderTasks"), "d": ("int", "interTestDelay"), "D": ("int", "deadlineForStonewalling"),
    "e": ("flag", "fsync"), "E": ("flag", "useExistingTestFile"), "f": ("str", "scriptFile"),
    "F": ("flag", "filePerProc"), "g": ("flag", "intraTestBarriers"), "G": ("int", "setTimeStampSignature"),
    "H": ("flag", "showHints"), "i": ("count", "repetitions"), "I": ("flag", "individualDataSets"),
    "j": ("int", "outlierThreshold"), "J": ("size", "setAlignment"), "k": ("flag", "keepFile"),
    "K": ("flag", "keepFileWithError"), "l": ("packet", "dataPacketType"), "m": ("flag", "multiFile"),
    "M": ("memory", "memoryPerNode"), "n": ("flag", "noFill"), "N": ("count", "numTasks"),
    "o": ("str", "testFile"), "O": ("directive", "directives"), "p": ("flag", "preallocate"),
    "P": ("flag", "useSharedFilePointer"), "q": ("flag", "quitOnError"), "Q": ("count", "taskPerNodeOffset"),
    "r": ("flag", "readFile"), "R": ("flag", "checkRead"), "s": ("count", "segmentCount"),
    "S": ("flag", "useStridedDatatype"), "t": ("size", "transferSize"), "T": ("int", "maxTimeDuration"),
    "u": ("flag", "uniqueDir"), "U": ("str", "hintsFileName"), "v": ("flag", "verbose"),
    "V": ("flag", "useFileView"), "w": ("flag", "writeFile"), "W": ("flag", "checkWrite"),
    "x": ("flag", "singleXferAttempt"), "X": ("int", "reorderTasksRandomSeed"), "Y": ("flag", "fsyncPerWrite"),
    "z": ("flag", "randomOffset"), "Z": ("flag", "reorderTasksRandom"),
}
LONG: Dict[str, str] = {
    "dryRun": "flag", "warningAsErrors": "flag", "randomPrefill": "size", "random-offset-seed": "int",
    "posix.odirect": "flag", "posix.rangelocks": "flag", "posix.lustre.stripecount": "int",
    "posix.lustre.stripesize": "size", "posix.lustre.startost": "int", "posix.lustre.pool": "str",
    "posix.lustre.ignorelocks": "flag", "posix.gpfs.hintaccess": "flag", "posix.gpfs.releasetoken": "flag",
    "posix.gpfs.finegrainwritesharing": "flag", "posix.gpfs.finegrainreadsharing": "flag",
    "posix.gpfs.createsharing": "flag",
    "mpiio.hintsFileName": "str", "mpiio.showHints": "flag", "mpiio.preallocate": "flag",
    "mpiio.useStridedDatatype": "flag", "mpiio.useFileView": "flag",
    "hdf5.collectiveMetadata": "flag", "hdf5.hintsFileName": "str", "hdf5.showHints": "flag",
    "hdf5.individualDataSets": "flag", "hdf5.noFill": "flag", "hdf5.setAlignment": "size",
    "hdf5.chunkSize": "size",
    "mmap.madv_dont_need": "flag", "mmap.madv_pattern": "flag",
    "dummy.delay-create": "int", "dummy.delay-close": "int", "dummy.delay-sync": "int",
    "dummy.delay-xfer": "int", "dummy.delay-only-rank0": "flag",
}
# -O keys (case-insensitive in IOR)
DIRECTIVES: FrozenSet[str] = frozenset(k.lower() for k in (
    "api", "summaryFile", "summaryFormat", "saveRankPerformanceDetailsCSV", "refnum", "debug", "platform",
    "testFile", "hintsFileName", "deadlineForStonewalling", "stoneWallingWearOut", "stoneWallingWearOutIterations",
    "stoneWallingStatusFile", "minTimeDuration", "maxTimeDuration", "outlierThreshold", "numNodes", "numTasks",
    "numTasksOnNode0", "repetitions", "interTestDelay", "interIODelay", "readFile", "writeFile", "filePerProc",
    "taskPerNodeOffset", "reorderTasksConstant", "reorderTasksRandom", "reorderTasksRandomSeed", "reorderTasks",
    "checkWrite", "checkRead", "keepFile", "keepFileWithError", "multiFile", "quitOnError", "segmentCount",
    "blockSize", "transferSize", "setAlignment", "singleXferAttempt", "individualDataSets", "intraTestBarriers",
    "noFill", "verbose", "setTimeStampSignature", "collective", "preallocate", "storeFileOffset", "useFileView",
    "useSharedFilePointer", "useStridedDatatype", "showHints", "uniqueDir", "useExistingTestFile",
    "fsyncPerWrite", "fsync", "randomOffset", "memoryPerTask", "memoryPerNode", "lustreStripeCount",
    "lustreStripeSize", "lustreStartOST", "lustreIgnoreLocks", "gpfsHintAccess", "gpfsReleaseToken",
    "beegfsNumTargets", "beegfsChunkSize", "summaryAlways", "useO_DIRECT", "dataPacketType"))
_SIZE_DIRECTIVES = {"segmentcount", "blocksize", "transfersize", "setalignment", "memorypertask", "beegfschunksize"}
_SIZE_RE = re.compile(r"^(\d+)([kmgtpKMGTP]?)$")
_SUFFIX = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
SIZE_HELP = "a whole number with an optional k, m, g, t or p suffix (powers of 1024), e.g. 4096, 64k, 1m"
_REDIRECTIONS = re.compile(r"^(\d?>>?|\d?>&\d|<|\||&&|;|&)")


class IorCommandError(HpcrunError):
    """An IOR command line that IOR 4.0 would reject or misread; every problem is listed."""

    exit_code = 2

    def __init__(self, command: str, problems: Sequence[str]):
        self.command = command
        self.problems = list(problems)
        listed = " ".join(f"({i}) {p}" for i, p in enumerate(self.problems, 1))
        super().__init__(f"IOR command line '{command}' is not valid for IOR 4.0: {listed}")


@dataclass(frozen=True)
class IorArgs:
    """What an IOR argv asks for, after IOR 4.0's defaults are applied."""

    api: str
    transfer_size: int
    block_size: int
    segments: int
    reps: int
    file_per_proc: bool
    write: bool
    read: bool
    test_file: Optional[str]
    summary_format: str
    summary_file: Optional[str]
    verbose: int
    script: Optional[str]
    flags: FrozenSet[str]
    directives: Tuple[Tuple[str, str], ...]
    tasks: Optional[int] = None


@dataclass(frozen=True)
class IorPoint:
    """One point of a sweep: everything that goes on one IOR command line."""

    test_file: str
    transfer_size: int
    block_size: int
    api: str = "POSIX"
    segments: int = 1
    file_per_proc: bool = False
    reps: int = 1
    write: bool = True
    read: bool = True
    summary_file: Optional[str] = None
    fsync: bool = False
    reorder_tasks: bool = False
    collective: bool = False
    keep: bool = False


def ior_size(nbytes: int) -> str:
    """IOR's spelling of a size: the largest exact k/m/g suffix, else bytes (1048576 -> '1m')."""
    for suffix, mult in (("g", 2**30), ("m", 2**20), ("k", 2**10)):
        if nbytes > 0 and nbytes % mult == 0:
            return f"{nbytes // mult}{suffix}"
    return str(nbytes)


def parse_ior_size(text: str) -> Optional[int]:
    """Bytes for an IOR size argument, or None when IOR 4.0 would misread it."""
    m = _SIZE_RE.match(text.strip())
    return int(m.group(1)) * _SUFFIX[m.group(2).lower()] if m else None


def build_ior_argv(point: IorPoint, ior: str = "ior") -> List[str]:
    """The IOR argv for ``point``: JSON summary (to ``summary_file`` when given), never ``-v``.

    The result is checked with :func:`check_ior_argv`, so an impossible point raises
    :class:`IorCommandError` here instead of failing inside the job.
    """
    argv = [ior, "-a", point.api, "-t", ior_size(point.transfer_size), "-b", ior_size(point.block_size)]
    if point.segments != 1:
        argv += ["-s", str(point.segments)]
    if point.reps != 1:
        argv += ["-i", str(point.reps)]
    argv += [flag for flag, on in (("-w", point.write), ("-r", point.read), ("-e", point.fsync),
                                   ("-C", point.reorder_tasks), ("-c", point.collective),
                                   ("-F", point.file_per_proc), ("-k", point.keep)) if on]
    argv += ["-o", point.test_file, "-O", "summaryFormat=JSON"]
    if point.summary_file:
        argv += ["-O", f"summaryFile={point.summary_file}"]
    problems = []
    if not (point.write or point.read):
        problems.append("the point neither writes nor reads; set write, read or both")
    if point.segments < 1 or point.reps < 1:
        problems.append("segments and reps must be at least 1")
    if point.summary_file and any(c in point.summary_file for c in ",#"):
        problems.append(f"the summary file '{point.summary_file}' contains ',' or '#', which an -O directive "
                        "cannot carry")
    if problems:
        raise IorCommandError(shlex.join(argv), problems)
    check_ior_argv(argv)
    return argv


def split_command(command: str) -> Tuple[List[str], List[str]]:
    """Split a shell command line into (launcher argv, IOR argv); redirections and what follows are dropped."""
    try:
        tokens = shlex.split(command)
    except ValueError as exc:
        raise IorCommandError(command, [f"it cannot be split like a shell would ({exc})"]) from None
    for i, tok in enumerate(tokens):
        if _REDIRECTIONS.match(tok):
            tokens = tokens[:i]
            break
    for i, tok in enumerate(tokens):
        if os.path.basename(tok) == "ior":
            return tokens[:i], tokens[i:]
    raise IorCommandError(command, ["no 'ior' executable in it (the first word whose file name is 'ior')"])


def check_ior_command(command: str) -> IorArgs:
    """Check a whole shell command line (``mpirun -np 4 /path/ior -a POSIX ... > out 2>&1``)."""
    launcher, argv = split_command(command)
    args = check_ior_argv(argv, display=command)
    tasks = _launcher_tasks(launcher)
    return args if tasks is None else _replace_tasks(args, tasks)


def check_ior_argv(argv: Sequence[str], display: Optional[str] = None) -> IorArgs:
    """Validate an IOR argv (``argv[0]`` is the executable) against IOR 4.0's grammar and run rules."""
    shown = display or shlex.join(list(argv))
    problems: List[str] = []
    values: Dict[str, str] = {}
    flags: Set[str] = set()
    counts: Dict[str, int] = {}
    directives: List[Tuple[str, str]] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        i += 1
        if tok in ("-h", "--help"):
            problems.append(f"'{tok}' prints the help and exits without running a test")
            continue
        if tok.startswith("--") and len(tok) > 2:
            name, eq, inline = tok[2:].partition("=")
            kind = LONG.get(name)
            if kind is None:
                problems.append(f"unknown option '--{name}'" + _close(name, LONG))
                continue
            key = "--" + name
            if kind == "flag":
                if eq:
                    problems.append(f"'--{name}' is a flag and takes no value (IOR ignores '={inline}')")
                flags.add(key)
                continue
            value, i = (inline, i) if eq else _next_value(argv, i, key, problems)
        elif tok.startswith("-") and len(tok) >= 2:
            letter = tok[1]
            if letter not in SHORT:
                problems.append(f"unknown option '-{letter}'" + (f" (in '{tok}')" if len(tok) > 2 else ""))
                continue
            kind, _ = SHORT[letter]
            key = "-" + letter
            if kind == "flag":
                if len(tok) > 2:
                    problems.append(f"'{tok}': IOR 4.0 does not bundle flags and reads it as '-{letter}' only; "
                                    f"write {' '.join('-' + c for c in tok[1:])}")
                flags.add(key)
                counts[key] = counts.get(key, 0) + 1
                continue
            if len(tok) > 2:
                value = tok[3:] if tok[2] == "=" else tok[2:]
            else:
                value, i = _next_value(argv, i, key, problems)
        else:
            problems.append(f"'{tok}' is not an option: IOR takes no positional arguments")
            continue
        if value is None:
            continue
        if kind == "directive":
            directives.extend(_check_directives(value, problems))
        else:
            _check_value(key, kind, value, problems)
            values[key] = value
    args = _settle(values, flags, counts, directives, problems)
    if problems:
        raise IorCommandError(shown, problems)
    return args


def _next_value(argv: Sequence[str], i: int, key: str, problems: List[str]) -> Tuple[Optional[str], int]:
    if i >= len(argv):
        problems.append(f"'{key}' needs a value")
        return None, i
    return argv[i], i + 1


def _close(word: str, choices: Dict[str, str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '--{close[0]}'?" if close else ""


def _check_value(key: str, kind: str, value: str, problems: List[str]) -> None:
    if kind == "size" and parse_ior_size(value) is None:
        problems.append(f"'{key} {value}': not a size IOR reads correctly; use {SIZE_HELP}")
    elif kind == "count" and not value.isdigit():
        problems.append(f"'{key} {value}': expected a whole number")
    elif kind == "int" and not re.fullmatch(r"-?\d+", value):
        problems.append(f"'{key} {value}': expected an integer")
    elif kind == "api" and value.upper() not in {a.upper() for a in APIS}:
        problems.append(f"'{key} {value}': unknown API; IOR 4.0 knows {', '.join(APIS)} (those compiled in)")
    elif kind == "packet" and value not in ("offset", "incompressible", "timestamp", "o", "i", "t"):
        problems.append(f"'{key} {value}': the data packet type is one of offset, incompressible, timestamp "
                        "(or o, i, t)")
    elif kind == "memory" and not (re.fullmatch(r"\d+%", value) or parse_ior_size(value) is not None):
        problems.append(f"'{key} {value}': memoryPerNode is a size (e.g. 2g) or a percentage (e.g. 75%)")
    elif kind == "str" and not value:
        problems.append(f"'{key}' needs a non-empty value")


def _check_directives(text: str, problems: List[str]) -> List[Tuple[str, str]]:
    found = []
    for part in text.split(","):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            problems.append(f"'-O {part}': a directive is key=value (several are separated by commas)")
            continue
        low = key.lower()
        if low not in DIRECTIVES:
            problems.append(f"'-O {part}': unknown directive '{key}'")
            continue
        if low == "summaryformat" and value.lower() not in ("default", "json", "csv"):
            problems.append(f"'-O {part}': summaryFormat is default, JSON or CSV")
        elif low in _SIZE_DIRECTIVES and parse_ior_size(value) is None:
            problems.append(f"'-O {part}': not a size IOR reads correctly; use {SIZE_HELP}")
        found.append((key, value))
    return found


def _settle(values: Dict[str, str], flags: Set[str], counts: Dict[str, int],
            directives: List[Tuple[str, str]], problems: List[str]) -> IorArgs:
    d = {k.lower(): v for k, v in directives}
    transfer = _size_of(values.get("-t") or d.get("transfersize"), DEFAULT_TRANSFER)
    block = _size_of(values.get("-b") or d.get("blocksize"), DEFAULT_BLOCK)
    segments = _size_of(values.get("-s") or d.get("segmentcount"), 1)
    reps = int(values["-i"]) if values.get("-i", "").isdigit() else 1
    summary_format = d.get("summaryformat", "default")
    write = "-w" in flags or d.get("writefile", "0") != "0"
    read = "-r" in flags or d.get("readfile", "0") != "0"
    if not (write or read or "-W" in flags or "-R" in flags):
        write = read = True  # IOR's default when no phase is named
    script = values.get("-f")
    if script is None:  # a script may set its own sizes: check the command line's only without one
        if transfer <= 0 or transfer % 8:
            problems.append(f"transfer size {transfer} must be a positive multiple of 8 bytes")
        elif block < transfer or block % transfer:
            problems.append(f"block size {block} must be a multiple of the transfer size {transfer} "
                            f"(IOR aborts: 'block size must be a multiple of transfer size')")
        elif "-z" in flags and block == transfer:
            problems.append("-z (random offsets) needs a block size larger than the transfer size")
    if segments < 1:
        problems.append("the segment count (-s) must be at least 1")
    if "-i" in values and reps < 1:
        problems.append("the repetition count (-i) must be at least 1")
    if "-C" in flags and "-Z" in flags:
        problems.append("-C (constant task reordering) and -Z (random task reordering) exclude each other")
    verbose = counts.get("-v", 0) + (int(d["verbose"]) if d.get("verbose", "").isdigit() else 0)
    if verbose and summary_format.lower() == "json":
        problems.append("-v with summaryFormat=JSON makes IOR 4.0 write invalid JSON; drop -v")
    return IorArgs(api=(values.get("-a") or d.get("api") or "POSIX"), transfer_size=transfer, block_size=block,
                   segments=segments, reps=reps, file_per_proc="-F" in flags or d.get("fileperproc", "0") != "0",
                   write=write, read=read, test_file=values.get("-o") or d.get("testfile"),
                   summary_format=summary_format, summary_file=d.get("summaryfile"), verbose=verbose,
                   script=script, flags=frozenset(flags), directives=tuple(directives))


def _size_of(text: Optional[str], default: int) -> int:
    if text is None:
        return default
    value = parse_ior_size(text)
    return default if value is None else value


def _launcher_tasks(launcher: List[str]) -> Optional[int]:
    for i, tok in enumerate(launcher[:-1]):
        if tok in ("-np", "-n", "--np", "--ntasks") and launcher[i + 1].isdigit():
            return int(launcher[i + 1])
    for tok in launcher:
        m = re.fullmatch(r"--(?:ntasks|np)=(\d+)", tok)
        if m:
            return int(m.group(1))
    return None


def _replace_tasks(args: IorArgs, tasks: int) -> IorArgs:
    return replace(args, tasks=tasks)
