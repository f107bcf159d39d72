"""The synthetic campaign of benchmarks/status_scale.py for tests: a plan of array tasks, its store as
submit leaves it, and the stand-in sacct first on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Tuple

from .conftest import REPO


def status_campaign(tmp_path: Path, monkeypatch, name: str, tasks: int) -> Tuple[ModuleType, Path, list, Path]:
    """(the status_scale module, the plan directory, its arrays, the file the stand-in sacct prints)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import status_scale as ss
        from synthetic_campaign import make_plan
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    plan = make_plan(tmp_path, name, tasks, "always")
    arrays = ss.record_submissions(plan)
    bindir, answer, _log = ss.stand_in_sacct(tmp_path)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return ss, plan, arrays, answer
