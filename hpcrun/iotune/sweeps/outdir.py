"""The sweep directory: checked before anything is written, built in a hidden sibling and
renamed into place, so an error never leaves a half-written directory behind.

Layout: ``iotune.json`` (what was planned), the job script (batch mode; ``iotune`` plus the
scheduler's suffix), ``logs/``,
``raw/`` (engine outputs, written by the job or by ``--local``), and after collecting
``results.json`` and ``bandwidth.png``; ``submitted.json`` once submitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from hpcrun.backends.scheduler import DEFAULT, scheduler_for
from hpcrun.errors import InputError, Problem
from hpcrun.iotune.sweeps.manifest import SweepManifest

MANIFEST = "iotune.json"
SCRIPT = "iotune" + scheduler_for(DEFAULT).script_suffix
SUBMITTED = "submitted.json"
RESULTS = "results.json"
PLOT = "bandwidth.png"


def check(out_dir: Path, force: bool) -> Path:
    out_dir = Path(os.path.abspath(out_dir))
    text = str(out_dir)
    if any(c in text for c in '\n\r"\0'):
        raise InputError([Problem(text, None, "--out", (
            "the directory name holds a newline or '\"', which cannot be written into a scheduler "
            "directive line; choose another name"))])
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InputError([Problem(text, None, "--out", "exists and is not a directory")])
        entries = [p.name for p in out_dir.iterdir()]
        if entries and MANIFEST not in entries:
            raise InputError([Problem(text, None, "--out", (
                "is not empty and holds no hpcrun sweep; choose a new or empty directory"))])
        if SUBMITTED in entries and not force:
            raise InputError([Problem(text, None, "--out", (
                "holds a sweep that was already submitted; use a new directory, or --force to "
                "replace it"))])
    return out_dir


@contextlib.contextmanager
def staging(out_dir: Path) -> Iterator[Path]:
    """A fresh hidden sibling of ``out_dir``; on success it replaces ``out_dir``."""
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.hpcrun-tmp-{os.getpid()}"
    old = parent / f".{out_dir.name}.hpcrun-old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for sub in ("raw", "logs"):
        (tmp / sub).mkdir(parents=True)
    try:
        yield tmp
        if out_dir.exists():
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    except BaseException:
        if old.exists() and not out_dir.exists():
            os.rename(old, out_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file atomically (temporary file in the same directory, then rename)."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n")


def read_manifest(sweep_dir: Path) -> SweepManifest:
    path = sweep_dir / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError([Problem(str(sweep_dir), None, "DIR", (
            f"is not a sweep directory (no {MANIFEST}); create one with `hpcrun iotune run ... --out DIR`"))]) \
            from None
    except (OSError, ValueError) as exc:
        raise InputError([Problem(str(path), None, "", f"cannot be read: {exc}")]) from None
    if not isinstance(data, dict) or data.get("kind") != "hpcrun-iotune":
        raise InputError([Problem(str(path), None, "", "is not an hpcrun iotune manifest")])
    return SweepManifest.from_dict(data)
