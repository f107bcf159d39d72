"""``--apply PROFILE_YAML``: write the recommendation into a site profile file under
``iotune.recommended``, editing the text so comments, order and every other key stay as they
were. The edited file is validated (with its ``extends`` chain) before it replaces the original
atomically; nothing is written when it would not validate."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpcrun.errors import InputError, Problem
from hpcrun.model.yamlsrc import load_yaml

_INDENT = re.compile(r"^( *)")


def exact_size(nbytes: int) -> str:
    for unit, mult in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return str(nbytes)


def block(rec: Dict[str, Any], operation: str, measured: str, sweep_dir: str, indent: str) -> List[str]:
    values = [("transfer_size", exact_size(rec["transfer"])), ("writers_per_node", str(rec["writers"])),
              ("target", json.dumps(rec["target"])), ("operation", operation),
              ("bandwidth_mib_s", repr(round(float(rec["bw_mib_mean"]), 1))),
              ("measured", json.dumps(measured)), ("sweep", json.dumps(sweep_dir))]
    inner = indent + "  "
    return [f"{indent}recommended:   # written by hpcrun iotune --apply"] + [f"{inner}{k}: {v}" for k, v in values]


def _indent(line: str) -> int:
    m = _INDENT.match(line)
    return len(m.group(1)) if m else 0


def _content(line: str) -> bool:
    s = line.strip()
    return bool(s) and not s.startswith("#")


def _block_end(lines: List[str], start: int) -> int:
    """Index after the last content line belonging to the key on line ``start`` (0-based)."""
    base = _indent(lines[start])
    end = start + 1
    last = start
    while end < len(lines):
        if _content(lines[end]):
            if _indent(lines[end]) <= base:
                break
            last = end
        end += 1
    return last + 1


def edit(text: str, path: Path, new_block: Callable[[str], List[str]]) -> str:
    src = load_yaml(path, text)
    lines = text.splitlines()
    where = src.positions.get(("iotune",))
    if where is None:
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join(lines + ["", "iotune:"] + new_block("  ")) + "\n"
    if not isinstance(src.data.get("iotune"), (dict, type(None))):
        raise InputError([Problem(str(path), where[1], "iotune", (
            "is not a mapping; --apply writes iotune.recommended into it"))])
    top = where[1] - 1
    after_colon = lines[top].split(":", 1)[1].strip() if ":" in lines[top] else ""
    if after_colon and not after_colon.startswith("#"):
        raise InputError([Problem(str(path), where[1], "iotune", (
            "is written in flow style ({...}); write it as a block mapping (one key per line) so "
            "--apply can add iotune.recommended without rewriting the file"))])
    rec = src.positions.get(("iotune", "recommended"))
    if rec is not None:
        start = rec[1] - 1
        end = _block_end(lines, start)
        indent = " " * _indent(lines[start])
        return "\n".join(lines[:start] + new_block(indent) + lines[end:]) + "\n"
    end = _block_end(lines, top)
    children = [ln for ln in lines[top + 1:end] if _content(ln)]
    indent = " " * (_indent(children[0]) if children else _indent(lines[top]) + 2)
    return "\n".join(lines[:end] + new_block(indent) + lines[end:]) + "\n"


def apply(profile_path: Path, recommendation: Optional[Dict[str, Any]], measured: str,
          sweep_dir: str) -> Tuple[Path, str]:
    """Write ``recommendation['overall']`` into the profile; returns (path, new text)."""
    from hpcrun.model.profiles import load_profile

    path = Path(profile_path)
    if not path.is_file() or path.suffix not in (".yaml", ".yml"):
        raise InputError([Problem(str(path), None, "--apply", "give the path of a site profile YAML file")])
    overall = (recommendation or {}).get("overall")
    if not overall:
        raise InputError([Problem(str(path), None, "--apply", (
            "the sweep has no successful point, so there is nothing to recommend; nothing was written"))])
    rec, op = overall["recommended"], overall["operation"]
    text = path.read_text(encoding="utf-8")
    new = edit(text, path, lambda indent: block(rec, op, measured, sweep_dir, indent))
    tmp = path.parent / f"{path.stem}.hpcrun-apply-{os.getpid()}{path.suffix}"
    try:
        tmp.write_text(new, encoding="utf-8")
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        try:
            load_profile(str(tmp))
        except InputError as exc:
            raise InputError([Problem(str(path), None, "--apply", (
                "the profile would not validate after adding iotune.recommended, so it was left "
                "unchanged:\n" + exc.render()))]) from None
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path, new
