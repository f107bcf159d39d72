"""Write a plan directory atomically and diff it against the previous one.

Everything is rendered in memory first, then written to a hidden sibling
directory that replaces the output directory only when complete, so an error
never leaves a half-written plan behind.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .dwgrammar import check_script
from .errors import HpcrunError, InputError, Problem
from .planner import Plan
from .render import RenderedFile, manifest_text, render_all

MANIFEST = "manifest.json"
SUBMITTED_MARKERS = ("submitted.json", "state.db")


class InternalError(HpcrunError):
    exit_code = 70


@dataclass
class WriteResult:
    out_dir: Path
    files: List[RenderedFile]
    diff: Optional[str]
    manifest: dict


def _check_rendered(plan: Plan, files: List[RenderedFile]) -> None:
    prefix = "#" + plan.profile.burst_buffer.directive
    grammar = plan.profile.burst_buffer.system in ("datawarp", "slurm-lua")
    for f in files:
        if f.path.startswith("jobs/"):
            problems = check_script(f.text.splitlines(), prefix, grammar)
            if problems:
                raise InternalError(f"rendered {f.path} has invalid directives: {problems}; "
                                    "this is a bug in hpcrun or a site template")


def render_plan(plan: Plan, out_dir: Path) -> tuple:
    plan_dir = str(out_dir)
    files = render_all(plan, plan_dir)
    _check_rendered(plan, files)
    digests = {f.path: hashlib.sha256(f.text.encode()).hexdigest() for f in files}
    text = manifest_text(plan, plan_dir, digests)
    return files, text


def _diff(old_dir: Path, files: List[RenderedFile], manifest: str) -> str:
    new: Dict[str, str] = {f.path: f.text for f in files}
    new[MANIFEST] = manifest
    old: Dict[str, str] = {}
    for root, _dirs, names in os.walk(old_dir):
        rel_root = Path(root).relative_to(old_dir)
        if rel_root.parts and rel_root.parts[0] in ("logs", "run"):
            continue
        for name in names:
            rel = str(rel_root / name) if rel_root.parts else name
            try:
                old[rel] = (Path(root) / name).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                old[rel] = ""
    chunks: List[str] = []
    for rel in sorted(set(old) | set(new)):
        a, b = old.get(rel), new.get(rel)
        if a == b:
            continue
        chunks.extend(difflib.unified_diff(
            (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if a is not None else "/dev/null",
            tofile=f"b/{rel}" if b is not None else "/dev/null", n=2))
    return "".join(chunks)


def write_plan(plan: Plan, out_dir: Path, want_diff: bool = False, force: bool = False) -> WriteResult:
    out_dir = Path(os.path.abspath(out_dir))
    if out_dir.exists():
        if not out_dir.is_dir():
            raise InputError([Problem(str(out_dir), None, "--out", "exists and is not a directory")])
        entries = [p.name for p in out_dir.iterdir()]
        if entries and MANIFEST not in entries:
            raise InputError([Problem(str(out_dir), None, "--out", (
                "is not empty and holds no hpcrun plan; choose a new or empty directory"))])
        if not force and any(m in entries for m in SUBMITTED_MARKERS):
            raise InputError([Problem(str(out_dir), None, "--out", (
                "holds a plan that was already submitted; re-planning would detach its jobs. "
                "Use a new directory, or --force if you really mean to replace it"))])
    files, manifest = render_plan(plan, out_dir)
    diff = _diff(out_dir, files, manifest) if (want_diff and out_dir.is_dir()) else (
        None if not want_diff else "")
    parent = out_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{out_dir.name}.hpcrun-tmp-{os.getpid()}"
    old = parent / f".{out_dir.name}.hpcrun-old-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        for sub in ("jobs", "bin", "logs", "run"):
            (tmp / sub).mkdir(parents=True)
        for f in files:
            target = tmp / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f.text, encoding="utf-8")
            if f.executable:
                target.chmod(0o755)
        (tmp / MANIFEST).write_text(manifest, encoding="utf-8")
        if out_dir.exists():
            # job logs and run records of the previous plan are kept, not thrown away
            for keep in ("logs", "run"):
                if (out_dir / keep).is_dir():
                    (tmp / keep).rmdir()
                    os.rename(out_dir / keep, tmp / keep)
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
    except BaseException:
        if old.exists() and not out_dir.exists():
            os.rename(old, out_dir)
        for keep in ("logs", "run"):
            if (tmp / keep).is_dir() and out_dir.is_dir() and not (out_dir / keep).exists():
                os.rename(tmp / keep, out_dir / keep)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return WriteResult(out_dir, files, diff, json.loads(manifest))
