"""The append-only sweep history: one JSON line per collected sweep, so sweeps on the same
site can be compared over time. Location: ``$HPCRUN_IOTUNE_HISTORY``, else
``$XDG_STATE_HOME/hpcrun/iotune-history.jsonl`` (``~/.local/state/...``)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Dict, List


def path() -> Path:
    explicit = os.environ.get("HPCRUN_IOTUNE_HISTORY")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "hpcrun" / "iotune-history.jsonl"


def entry(results: Dict[str, Any], sweep_dir: str) -> Dict[str, Any]:
    keys = ("sweep_id", "name", "created", "collected", "hpcrun_version", "mode", "engine", "environment",
            "sweep", "recommendation")
    data = {k: results.get(k) for k in keys}
    data["dir"] = sweep_dir
    data["targets"] = [{k: t.get(k) for k in ("name", "run_path", "fstype")} for t in results["targets"]]
    data["results"] = [{k: r.get(k) for k in ("target", "api", "nodes", "writers", "transfer", "block",
                                               "layout", "operation", "bw_mib_mean", "error")}
                       for r in results["results"]]
    return data


def append(results: Dict[str, Any], sweep_dir: str) -> bool:
    """Add the sweep unless its id is already recorded (collecting twice adds one line)."""
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry(results, sweep_dir), separators=(",", ":")) + "\n"
    with open(target, "a+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        if any(f'"sweep_id":{json.dumps(results["sweep_id"])}' in old for old in fh):
            return False
        fh.seek(0, os.SEEK_END)
        fh.write(line)
    return True


def read() -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path(), encoding="utf-8") as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue     # a line cut short by a crash does not hide the others
    except FileNotFoundError:
        pass
    return out
