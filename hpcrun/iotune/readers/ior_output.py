"""Read IOR 4.0 results: the JSON summary (``-O summaryFormat=JSON``) or the default text output.

Bandwidths are MiB/s (2**20 bytes per second) exactly as IOR reports them; sizes are bytes.
Damaged input (empty, truncated, an aborted run, ``-v`` mixed into JSON) gives an
:class:`IorParseError` whose one-paragraph message names the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from hpcrun.errors import SourceError

MIB = 2**20
OPERATIONS = ("write", "read")


class IorParseError(SourceError):
    """An IOR result file that cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class IorResult:
    """One access phase of one repetition (a JSON ``Results`` entry or a text result row)."""

    operation: str
    iteration: int
    bw_mib: float
    iops: float
    latency_s: float
    block_kib: float
    xfer_kib: float
    open_s: float
    wrrd_s: float
    close_s: float
    total_s: float


@dataclass(frozen=True)
class IorOp:
    """One summary row: one operation of one test, statistics over its repetitions."""

    operation: str
    api: str
    transfer_size: int
    block_size: int
    segments: int
    tasks: int
    tasks_per_node: int
    reps: int
    file_per_proc: bool
    bw_mib_max: float
    bw_mib_min: float
    bw_mib_mean: float
    ops_max: float
    ops_min: float
    ops_mean: float
    bw_mib_std: float = 0.0
    ops_std: float = 0.0
    mean_time_s: float = 0.0
    aggregate_mib: float = 0.0
    test_id: int = 0
    reference_number: int = 0
    reorder_tasks: bool = False
    stonewall_time_s: Optional[float] = None
    stonewall_bw_mib_mean: Optional[float] = None
    test_file: Optional[str] = None
    results: Tuple[IorResult, ...] = ()

    @property
    def bw_bytes_mean(self) -> float:
        """Mean bandwidth in bytes/s."""
        return self.bw_mib_mean * MIB

    @property
    def aggregate_bytes(self) -> int:
        """Bytes one repetition moves when not cut short: block x segments x tasks."""
        return self.block_size * self.segments * self.tasks


@dataclass(frozen=True)
class IorRun:
    """Everything read from one IOR output file."""

    source: str
    version: Optional[str]
    command: Optional[str]
    ops: Tuple[IorOp, ...]
    format: str = "json"
    machine: Optional[str] = None
    began: Optional[str] = None
    finished: Optional[str] = None
    warnings: Tuple[str, ...] = ()

    def op(self, operation: str, test_id: int = 0) -> Optional[IorOp]:
        """The summary row of ``operation`` in test ``test_id``, or None."""
        for op in self.ops:
            if op.operation == operation and op.test_id == test_id:
                return op
        return None


# ---- JSON --------------------------------------------------------------------------------------

_BARE_NAN = re.compile(r"(:\s*)-?nan\b")
_VERBOSE_MAX = re.compile(r"\]\s*\]\s*,\s*(\"max\"\s*:)")
_JSON_START = re.compile(r"^\{", re.MULTILINE)


def parse_json(text: str, source: str) -> IorRun:
    """Parse IOR's JSON summary (``-O summaryFormat=JSON``), tolerating its known defects."""
    if not text.strip():
        raise IorParseError(source, "the IOR JSON summary is empty: IOR stopped before writing anything, "
                            "usually because it rejected its options (e.g. a block size that is not a multiple "
                            "of the transfer size) or could not start; the run's stdout/stderr says why.")
    m = _JSON_START.search(text)
    if m is None:
        raise IorParseError(source, "no JSON object found: an IOR JSON summary starts with a line '{'. "
                            "Is this IOR's text output? Read it with parse_text.")
    data, warnings = _load_tolerant(text[m.start():], source)
    if not isinstance(data, dict):
        raise IorParseError(source, "the JSON is not an object: an IOR 4.0 summary is an object with "
                            "'Version', 'tests' and 'summary' keys.")
    if "summary" not in data:
        raise IorParseError(source, "the JSON has no 'summary' section: the IOR run did not finish "
                            "(IOR writes the summary after the last test).")
    summary = data["summary"]
    if not isinstance(summary, list) or not summary:
        raise IorParseError(source, "the 'summary' section is empty: IOR ran no write or read phase.")
    tests = data.get("tests")
    results, files = _json_tests(tests if isinstance(tests, list) else [], source)
    ops = []
    for k, row in enumerate(summary):
        if not isinstance(row, dict):
            raise IorParseError(source, f"summary[{k}] is not an object.")
        ops.append(_json_op(row, k, results, files, source))
    return IorRun(source=source, version=_str(data.get("Version")), command=_str(data.get("Command line")),
                  ops=tuple(ops), format="json", machine=_str(data.get("Machine")),
                  began=_str(data.get("Began")), finished=_str(data.get("Finished")), warnings=tuple(warnings))


def _load_tolerant(body: str, source: str) -> Tuple[Any, List[str]]:
    """json.loads with the repairs IOR 4.0 output needs; raise a clear error when none helps."""
    warnings: List[str] = []
    body = _BARE_NAN.sub(r"\1NaN", body)
    decoder = json.JSONDecoder()
    try:
        return decoder.raw_decode(body)[0], warnings
    except json.JSONDecodeError as exc:
        first_error = exc
    if _VERBOSE_MAX.search(body):
        body = _VERBOSE_MAX.sub(r"], \1", body)
        warnings.append("the JSON came from a run with -v (IOR 4.0 then closes 'Results' twice); repaired")
        try:
            return decoder.raw_decode(body)[0], warnings
        except json.JSONDecodeError as exc:
            first_error = exc
    lines = body.splitlines()
    kept = [ln for ln in lines if not ln[:1].isalnum()]
    if len(kept) != len(lines):
        warnings.append(f"skipped {len(lines) - len(kept)} line(s) of IOR messages mixed into the JSON")
        try:
            return decoder.raw_decode("\n".join(kept))[0], warnings
        except json.JSONDecodeError as exc:
            first_error = exc
            body = "\n".join(kept)
    stripped = body.rstrip()
    if first_error.pos >= len(stripped) - 1 or '"Finished"' not in body:
        where = "before the 'summary' section" if '"summary"' not in body else "inside the 'summary' section"
        raise IorParseError(source, f"the IOR JSON summary is truncated ({len(stripped.splitlines())} lines, "
                            f"ending {where}): the run stopped early, usually because IOR aborted "
                            "(MPI_ABORT); the run's stdout/stderr says why.")
    raise IorParseError(source, f"the IOR JSON summary is not valid JSON (line {first_error.lineno}, column "
                        f"{first_error.colno}: {first_error.msg}) and none of the known IOR 4.0 defects explains "
                        "it. Run IOR with -O summaryFormat=JSON -O summaryFile=FILE and without -v.")


def _json_tests(tests: List[Any], source: str) -> Tuple[Dict[Tuple[int, str], List[IorResult]], Dict[int, str]]:
    results: Dict[Tuple[int, str], List[IorResult]] = {}
    files: Dict[int, str] = {}
    for i, test in enumerate(tests):
        if not isinstance(test, dict):
            continue
        test_id = test.get("TestID", i)
        test_id = test_id if isinstance(test_id, int) else i
        params = test.get("Parameters")
        options = test.get("Options")
        name = ((params.get("testFileName") if isinstance(params, dict) else None)
                or (options.get("test filename") if isinstance(options, dict) else None))
        if isinstance(name, str):
            files[test_id] = name
        for j, entry in enumerate(test.get("Results") or []):
            if not isinstance(entry, dict) or entry.get("access") not in OPERATIONS:
                continue  # "remove" entries (-v) and anything unknown
            op = str(entry["access"])
            where = f"tests[{i}].Results[{j}]"
            bucket = results.setdefault((test_id, op), [])
            bucket.append(IorResult(
                operation=op, iteration=len(bucket),  # JSON has no iteration index: use the position
                bw_mib=_num(entry, "bwMiB", where, source), iops=_num(entry, "iops", where, source),
                latency_s=_num(entry, "latency", where, source), block_kib=_num(entry, "blockKiB", where, source),
                xfer_kib=_num(entry, "xferKiB", where, source), open_s=_num(entry, "openTime", where, source),
                wrrd_s=_num(entry, "wrRdTime", where, source), close_s=_num(entry, "closeTime", where, source),
                total_s=_num(entry, "totalTime", where, source)))
    return results, files


def _json_op(row: Dict[str, Any], k: int, results: Dict[Tuple[int, str], List[IorResult]],
             files: Dict[int, str], source: str) -> IorOp:
    where = f"summary[{k}]"
    operation = row.get("operation")
    if operation not in OPERATIONS:
        raise IorParseError(source, f"{where}: \"operation\" is {operation!r}; expected 'write' or 'read'.")
    test_id = _int(row, "TestID", where, source)
    return IorOp(
        operation=str(operation), api=str(row.get("API", "")),
        transfer_size=_int(row, "transferSize", where, source), block_size=_int(row, "blockSize", where, source),
        segments=_int(row, "segmentCount", where, source), tasks=_int(row, "numTasks", where, source),
        tasks_per_node=_int(row, "tasksPerNode", where, source), reps=_int(row, "repetitions", where, source),
        file_per_proc=bool(_int(row, "filePerProc", where, source)),
        bw_mib_max=_num(row, "bwMaxMIB", where, source), bw_mib_min=_num(row, "bwMinMIB", where, source),
        bw_mib_mean=_num(row, "bwMeanMIB", where, source), bw_mib_std=_num(row, "bwStdMIB", where, source),
        ops_max=_num(row, "OPsMax", where, source), ops_min=_num(row, "OPsMin", where, source),
        ops_mean=_num(row, "OPsMean", where, source), ops_std=_num(row, "OPsSD", where, source),
        mean_time_s=_num(row, "MeanTime", where, source), aggregate_mib=_num(row, "xsizeMiB", where, source),
        test_id=test_id, reference_number=int(row.get("ReferenceNumber", 0) or 0),
        reorder_tasks=bool(row.get("reorderTasks", 0)),
        stonewall_time_s=_num(row, "StoneWallTime", where, source) if "StoneWallTime" in row else None,
        stonewall_bw_mib_mean=(_num(row, "StoneWallbwMeanMIB", where, source)
                               if "StoneWallbwMeanMIB" in row else None),
        test_file=files.get(test_id), results=tuple(results.get((test_id, str(operation)), ())))


def _num(obj: Dict[str, Any], key: str, where: str, source: str) -> float:
    if key not in obj:
        raise IorParseError(source, f"{where} has no \"{key}\": not an IOR 4.0 JSON summary, or a damaged one.")
    value = obj[key]
    if isinstance(value, bool):
        raise IorParseError(source, f"{where}: \"{key}\" is {value!r}; expected a number.")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("inf", "-inf", "nan", "-nan"):
        return float(value.strip().lower().replace("-nan", "nan"))  # IOR quotes inf
    raise IorParseError(source, f"{where}: \"{key}\" is {value!r}; expected a number.")


def _int(obj: Dict[str, Any], key: str, where: str, source: str) -> int:
    value = _num(obj, key, where, source)
    if not math.isfinite(value) or value != int(value):
        raise IorParseError(source, f"{where}: \"{key}\" is {obj[key]!r}; expected a whole number.")
    return int(value)


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


# ---- text --------------------------------------------------------------------------------------

_HEADER_RE = re.compile(r"^IOR-(\S+): MPI Coordinated Test of Parallel I/O")
_KEY_RE = re.compile(r"^(Began|Command line|Machine|Finished|TestID|test filename)\s*: ?(.*)$")
_ROW_RE = re.compile(r"^(write|read|remove)\s")
_SUMMARY_COLUMNS = ("Operation", "Max(MiB)", "Min(MiB)", "Mean(MiB)", "StdDev(MiB)", "Max(OPs)", "Min(OPs)",
                    "Mean(OPs)", "StdDev(OPs)", "Mean(s)", "Stonewall(s)", "Stonewall(MiB)", "Test#", "#Tasks",
                    "tPN", "reps", "fPP", "reord", "reordoff", "reordrand", "seed", "segcnt", "blksiz", "xsize",
                    "aggs(MiB)", "API", "RefNum")
_PROBLEM_RE = re.compile(r"^(ERROR|Error)\b|FAILED in|Unrecognized parameter|Invalid option|Syntax error|"
                         r"MPI_ABORT was invoked")


def parse_text(text: str, source: str) -> IorRun:
    """Parse IOR's default human-readable output (stdout of a run without summaryFormat)."""
    if not text.strip():
        raise IorParseError(source, "the IOR output is empty: IOR printed nothing (it did not start, or its "
                            "output went elsewhere).")
    if text.lstrip().startswith("{"):
        raise IorParseError(source, "this is JSON, not IOR's text output: read it with parse_json.")
    lines = text.splitlines()
    info: Dict[str, str] = {}
    version: Optional[str] = None
    test_id = 0
    files: Dict[int, str] = {}
    results: Dict[Tuple[int, str], List[IorResult]] = {}
    summary_at: Optional[int] = None
    for n, line in enumerate(lines):
        m = _HEADER_RE.match(line)
        if m and version is None:
            version = m.group(1)
            continue
        m = _KEY_RE.match(line)
        if m:
            key, value = m.group(1), m.group(2).strip()
            if key == "TestID" and value.isdigit():
                test_id = int(value)
            elif key == "test filename":
                files[test_id] = value
            else:
                info.setdefault(key, value)
            continue
        if line.startswith("Summary of all tests:"):
            summary_at = n
            break
        if _ROW_RE.match(line) and not line.startswith("remove"):
            row = _text_result(line, n + 1, source)
            if row is not None:
                results.setdefault((test_id, row.operation), []).append(row)
    if summary_at is None:
        raise IorParseError(source, _no_summary_reason(lines))
    ops = _text_summary(lines, summary_at, results, files, source)
    for line in lines[summary_at:]:
        m = _KEY_RE.match(line)
        if m and m.group(1) == "Finished":
            info["Finished"] = m.group(2).strip()
    return IorRun(source=source, version=version, command=info.get("Command line"), ops=tuple(ops),
                  format="text", machine=info.get("Machine"), began=info.get("Began"),
                  finished=info.get("Finished"))


def _text_float(token: str) -> float:
    return float("nan") if token in ("-", "NA") else float(token)


def _text_result(line: str, lineno: int, source: str) -> Optional[IorResult]:
    fields = line.split()
    if len(fields) != 11:
        return None  # e.g. a row cut by an abort
    try:
        values = [_text_float(f) for f in fields[1:10]]
        iteration = int(fields[10])
    except ValueError:
        raise IorParseError(source, f"line {lineno}: result row {line.strip()!r} has a value that is not a "
                            "number; expected access, 9 numbers and the iteration.") from None
    return IorResult(fields[0], iteration, *values)


def _no_summary_reason(lines: List[str]) -> str:
    problem = next((ln.strip() for ln in lines if _PROBLEM_RE.search(ln) and not ln.startswith("-")), None)
    has_results = any(ln.startswith("Results:") for ln in lines)
    what = ("IOR did not finish: the output has no 'Summary of all tests' table"
            + (" (it stops inside the results)" if has_results else ""))
    if problem:
        return f"{what}; it reports: {problem}"
    if not any(_HEADER_RE.match(ln) for ln in lines):
        return (f"{what}, and no 'IOR-<version>: MPI Coordinated Test of Parallel I/O' header either: "
                "this is not IOR 4.0 text output, or it was cut short.")
    return f"{what}; the output was cut short (the job was killed or ran out of time?)."


def _text_summary(lines: List[str], at: int, results: Dict[Tuple[int, str], List[IorResult]],
                  files: Dict[int, str], source: str) -> List[IorOp]:
    header = lines[at + 1].split() if at + 1 < len(lines) else []
    if len(header) != len(_SUMMARY_COLUMNS) or header[0] != "Operation":
        raise IorParseError(source, f"line {at + 2}: the summary header has {len(header)} columns; IOR 4.0 prints "
                            f"{len(_SUMMARY_COLUMNS)} ({' '.join(_SUMMARY_COLUMNS[:4])} ... API RefNum).")
    ops = []
    for n in range(at + 2, len(lines)):
        line = lines[n]
        if not _ROW_RE.match(line):
            if line.startswith("Finished") or not line.strip():
                break
            continue
        fields = line.split()
        if len(fields) != len(_SUMMARY_COLUMNS):
            raise IorParseError(source, f"line {n + 1}: the summary row has {len(fields)} fields, expected "
                                f"{len(_SUMMARY_COLUMNS)}: the output is damaged or not from IOR 4.0.")
        row = dict(zip(_SUMMARY_COLUMNS, fields))
        try:
            ops.append(_text_op(row, results, files))
        except ValueError:
            raise IorParseError(source, f"line {n + 1}: the summary row {line.strip()!r} has a value that is not "
                                "a number where IOR 4.0 prints one.") from None
    if not ops:
        raise IorParseError(source, f"line {at + 1}: 'Summary of all tests' has no write or read row.")
    return ops


def _text_op(row: Dict[str, str], results: Dict[Tuple[int, str], List[IorResult]],
             files: Dict[int, str]) -> IorOp:
    def opt(key: str) -> Optional[float]:
        return None if row[key] == "NA" else float(row[key])

    test_id = int(row["Test#"])
    op = row["Operation"]
    return IorOp(
        operation=op, api=row["API"], transfer_size=int(row["xsize"]), block_size=int(row["blksiz"]),
        segments=int(row["segcnt"]), tasks=int(row["#Tasks"]), tasks_per_node=int(row["tPN"]),
        reps=int(row["reps"]), file_per_proc=bool(int(row["fPP"])),
        bw_mib_max=float(row["Max(MiB)"]), bw_mib_min=float(row["Min(MiB)"]), bw_mib_mean=float(row["Mean(MiB)"]),
        bw_mib_std=float(row["StdDev(MiB)"]), ops_max=float(row["Max(OPs)"]), ops_min=float(row["Min(OPs)"]),
        ops_mean=float(row["Mean(OPs)"]), ops_std=float(row["StdDev(OPs)"]), mean_time_s=float(row["Mean(s)"]),
        aggregate_mib=float(row["aggs(MiB)"]), test_id=test_id, reference_number=int(row["RefNum"]),
        reorder_tasks=bool(int(row["reord"])), stonewall_time_s=opt("Stonewall(s)"),
        stonewall_bw_mib_mean=opt("Stonewall(MiB)"), test_file=files.get(test_id),
        results=tuple(results.get((test_id, op), ())))


# ---- files -------------------------------------------------------------------------------------

_LOOKS_JSON = re.compile(r"^\{\s*$\s*\"Version\"", re.MULTILINE)


def parse_file(path: Union[str, Path]) -> IorRun:
    """Read an IOR result file, JSON or text (detected from the content, not the name).

    When a JSON summary cannot be read and ``<file>.log`` (the run's captured stdout/stderr)
    exists beside it, the first error line of that log is added to the message.
    """
    path = Path(path)
    source = str(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise IorParseError(source, f"cannot be read: {exc.strerror or exc}.") from None
    head = text.lstrip()
    if head.startswith("access,bw(MiB/s)"):
        raise IorParseError(source, "this is IOR's CSV summary (summaryFormat=CSV), which has no API, sizes or "
                            "summary statistics; rerun with -O summaryFormat=JSON -O summaryFile=FILE.")
    if head.startswith("{") or _LOOKS_JSON.search(text) or (not head and path.suffix == ".json"):
        try:
            return parse_json(text, source)
        except IorParseError as exc:
            hint = _log_hint(path)
            if hint:
                raise IorParseError(source, f"{exc.problem} The run's log {path.name}.log says: {hint}") from None
            raise
    return parse_text(text, source)


def _log_hint(path: Path) -> Optional[str]:
    log = path.with_name(path.name + ".log")
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((ln.strip() for ln in lines if _PROBLEM_RE.search(ln) and not ln.startswith("-")), None)
