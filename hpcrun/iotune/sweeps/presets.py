"""Load a sweep: a preset (``iobench/<name>.yaml`` or a YAML path) overlaid with
command-line options, validated into a :class:`Sweep` with file/line/key errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.errors import InputError, Problem, did_you_mean
from hpcrun.iotune.sweeps.sweep import Sweep
from hpcrun.model.validate import build
from hpcrun.model.yamlsrc import KeyPath, Located, load_yaml
from hpcrun.resources import iobench_dir

COMMAND_LINE = "<command line>"

# sweep key -> the command-line option that sets it (for error messages)
OPTIONS: Dict[str, str] = {
    "transfer_sizes": "--transfer-size", "block_sizes": "--block-size", "writers": "--writers",
    "nodes": "--nodes", "apis": "--api", "layout": "--file-per-process/--shared-file",
    "targets": "--target", "reps": "--reps", "operations": "--read/--write", "engine": "--engine",
    "darshan": "--darshan", "direct": "--direct", "walltime": "--walltime", "partition": "--partition",
    "name": "--name", "container": "--container/--image",
}


def preset_dirs() -> List[Path]:
    """HPCRUN_IOBENCH_PATH directories first, then the shipped presets."""
    paths = [Path(p) for p in os.environ.get("HPCRUN_IOBENCH_PATH", "").split(os.pathsep) if p]
    return paths + [iobench_dir()]


def available() -> Dict[str, Path]:
    found: Dict[str, Path] = {}
    for directory in preset_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def locate(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if path.is_file():
            return path
        raise InputError([Problem(COMMAND_LINE, None, "PRESET", f"preset file '{name}' does not exist")])
    names = available()
    if name in names:
        return names[name]
    raise InputError([Problem(COMMAND_LINE, None, "PRESET", (
        f"no sweep preset named '{name}'.{did_you_mean(name, names)} Shipped and found presets: "
        f"{', '.join(sorted(names)) or '(none)'}; give a YAML path or add directories with "
        "HPCRUN_IOBENCH_PATH."))])


def load_sweep(preset: Optional[str], overrides: Dict[str, Any]) -> Tuple[Sweep, Located]:
    """Validate ``preset`` (name or path, may be None) with ``overrides`` (sweep key -> value
    from the command line) on top. All problems are reported together."""
    if preset is not None:
        src = load_yaml(locate(preset))
    else:
        src = Located({}, COMMAND_LINE, {})
    data = dict(src.data)
    positions: Dict[KeyPath, Tuple[str, Any]] = dict(src.positions)
    for key, value in overrides.items():
        if value is None:
            continue
        data[key] = value
        for path in [p for p in positions if p and p[0] == key]:
            del positions[path]
        positions[(key,)] = (COMMAND_LINE, None)
    if preset is None and "name" not in data:
        data["name"] = "sweep"
    merged = Located(data, src.file, positions)
    try:
        sweep = build(Sweep, merged)
    except InputError as exc:
        raise InputError([_cli_key(p) for p in exc.problems]) from None
    return sweep, merged


def _cli_key(problem: Problem) -> Problem:
    if problem.file != COMMAND_LINE:
        return problem
    head = problem.key.split(".")[0].split("[")[0]
    return Problem(problem.file, None, OPTIONS.get(head, problem.key), problem.message)
