"""The DataWarp directive grammar, used to check every ``#DW``/``#BB`` line we emit.

Facts (hpc-reference §1): verbs jobdw, persistentdw, stage_in, stage_out, swap
under ``#DW``; create_persistent, destroy_persistent under ``#BB``; integer
capacities with a unit (``3.5TB`` is read as 3 bytes); key=value pairs separated
by blanks; at most one jobdw per job.
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List, Optional, Set

CAPACITY_RE = re.compile(r"^[0-9]+(N|NODES?|K|KIB|M|MIB|G|GIB|T|TIB|P|PIB|KB|MB|GB|TB|PB)?$",
                         re.IGNORECASE)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_BB_VAR = re.compile(r"^\$(\{)?(DW_JOB_STRIPED|DW_JOB_PRIVATE|DW_PERSISTENT_STRIPED_[A-Za-z0-9_]+)(?(1)\})(/.*)?$")

VERBS: Dict[str, Dict[str, Set[str]]] = {
    "jobdw": {"required": {"capacity", "access_mode", "type"}, "optional": {"pool", "pfs"}},
    "persistentdw": {"required": {"name"}, "optional": set()},
    "stage_in": {"required": {"source", "destination", "type"}, "optional": set()},
    "stage_out": {"required": {"source", "destination", "type"}, "optional": set()},
    "create_persistent": {"required": {"name", "capacity"},
                          "optional": {"access", "access_mode", "pool", "type"}},
    "destroy_persistent": {"required": {"name"}, "optional": {"hurry"}},
}
BB_VERBS = {"create_persistent", "destroy_persistent"}


def parse(line: str, prefix: str = "#DW") -> Dict[str, str]:
    body = line[len(prefix):].strip()
    parts = body.split()
    out: Dict[str, str] = {"verb": parts[0] if parts else ""}
    for token in parts[1:]:
        key, _, value = token.partition("=")
        out[key] = value
    return out


@functools.lru_cache(maxsize=4096)
def check_line(line: str, prefix: str = "#DW") -> Optional[str]:
    """Why a DataWarp-style directive line is invalid, or None when it is fine (cached: the
    jobdw and stage_out lines of a plan's per-job scripts repeat)."""
    bb = line.startswith("#BB ")
    if not (line.startswith(prefix + " ") or bb):
        return f"a directive starts at column 0 with '{prefix} ' or '#BB '"
    if "\n" in line or line.rstrip() != line:
        return "a directive is one line without trailing blanks"
    fields = parse(line, "#BB" if bb else prefix)
    verb = fields.pop("verb")
    if verb not in VERBS:
        return f"unknown verb '{verb}'"
    if (verb in BB_VERBS) != bb:
        return f"'{verb}' belongs under {'#BB' if verb in BB_VERBS else prefix}"
    spec = VERBS[verb]
    missing = spec["required"] - set(fields)
    if missing:
        return f"{verb} needs {', '.join(sorted(missing))}"
    unknown = set(fields) - spec["required"] - spec["optional"]
    if unknown:
        return f"{verb} does not take {', '.join(sorted(unknown))}"
    if "capacity" in fields and not CAPACITY_RE.match(fields["capacity"]):
        return f"capacity '{fields['capacity']}' must be an integer with a unit (e.g. 3500GB)"
    if verb == "jobdw":
        if fields["type"] not in ("scratch", "cache"):
            return "jobdw type is scratch or cache"
        modes = fields["access_mode"].split(",")
        if not modes or any(m not in ("striped", "private", "ldbalance") for m in modes):
            return "access_mode is striped, private or striped,private"
    if "name" in fields and not _NAME_RE.match(fields["name"]):
        return f"name '{fields['name']}' must start with a letter"
    if verb in ("stage_in", "stage_out"):
        if fields["type"] not in ("file", "directory", "list"):
            return "stage type is file, directory or list"
        bb_side, fs_side = ((fields["destination"], fields["source"]) if verb == "stage_in"
                            else (fields["source"], fields["destination"]))
        if not _BB_VAR.match(bb_side):
            return f"the burst-buffer side '{bb_side}' must start with $DW_JOB_STRIPED or similar"
        if not fs_side.startswith("/"):
            return f"the file-system side '{fs_side}' must be an absolute path"
    return None


def _first_command(lines: List[str]) -> int:
    """Index of the first line that is neither blank nor a comment (the shebang included)."""
    for i, line in enumerate(lines):
        if i == 0 and line.startswith("#!"):
            continue
        if line.strip() and not line.startswith("#"):
            return i
    return len(lines)


def check_script(lines: List[str], prefix: str = "#DW", grammar: bool = True, *,
                 job_directive: str) -> List[str]:
    """Problems with the directive block: placement and (DataWarp) grammar, one jobdw at most.

    ``job_directive`` is the scheduler's own directive (its lines are placed, not parsed here).
    """
    problems: List[str] = []
    jobdw = 0
    in_header = True
    tokens = (job_directive, prefix + " ", "#BB ")
    # Fast path: after the first command only a misplaced directive is a problem, and every
    # line the loop below would flag there contains one of the tokens, so a body without any
    # of them needs no per-line scan (half the cost on generated scripts; same result).
    end = _first_command(lines)
    if end < len(lines):
        rest = "\n".join(lines[end:])
        if not any(t in rest for t in tokens):
            lines = lines[:end]
    for n, line in enumerate(lines, 1):
        if line.startswith("# ") or line == "#":
            continue   # a plain comment: most of a header (no directive token starts with "# ")
        stripped = line.strip()
        if n == 1 and line.startswith("#!"):
            continue
        if in_header and stripped and not line.startswith("#"):
            in_header = False
        is_directive = line.startswith(tokens) or stripped.startswith(tokens)
        if not is_directive:
            continue
        if not in_header:
            problems.append(f"line {n}: directive after the first command is ignored by the scheduler")
            continue
        if not line.startswith("#"):
            problems.append(f"line {n}: directive not at column 0")
            continue
        if line.startswith(job_directive) or not grammar:
            continue
        why = check_line(line, prefix)
        if why:
            problems.append(f"line {n}: {why}")
        if line[len(prefix):].split(None, 1)[:1] == ["jobdw"]:
            jobdw += 1
    if jobdw > 1:
        problems.append("more than one jobdw line")
    return problems
