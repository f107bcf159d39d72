"""Where shipped data lives: in a source checkout or inside an installed wheel.

The repository keeps ``templates/``, ``site-profiles/`` and ``iobench/`` at the top
level; the wheel maps them to ``hpcrun/templates`` etc. (see setup.cfg).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

_PKG = Path(__file__).resolve().parent


def _shipped(installed: str, source: str) -> Path:
    for candidate in (_PKG / installed, _PKG.parent / source):
        if candidate.is_dir():
            return candidate
    return _PKG / installed


def templates_dir() -> Path:
    return _shipped("templates", "templates")


def profiles_dir() -> Path:
    return _shipped("site_profiles", "site-profiles")


def iobench_dir() -> Path:
    """Shipped I/O sweep presets (``hpcrun iotune run PRESET``)."""
    return _shipped("iobench", "iobench")


def profile_search_path() -> List[Path]:
    """Site directories first (HPCRUN_PROFILE_PATH, user config), shipped profiles last."""
    paths = [Path(p) for p in os.environ.get("HPCRUN_PROFILE_PATH", "").split(os.pathsep) if p]
    paths.append(Path(os.path.expanduser("~/.config/hpcrun/site-profiles")))
    paths.append(profiles_dir())
    return paths


def template_search_path(extra: List[Path]) -> List[Path]:
    """Site template overrides are searched before the built-in templates."""
    paths = list(extra)
    paths += [Path(p) for p in os.environ.get("HPCRUN_TEMPLATE_PATH", "").split(os.pathsep) if p]
    paths.append(templates_dir())
    return paths


SITE_TEMPLATE_DIR = "templates"


def site_template_dirs(profile_files: List[Path]) -> List[Path]:
    """Template directories in search order: beside each profile file (child first), then
    HPCRUN_TEMPLATE_PATH, then the built-in templates."""
    extra = [Path(f).parent / SITE_TEMPLATE_DIR for f in profile_files]
    return template_search_path([p for p in extra if p.is_dir()])
