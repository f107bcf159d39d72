"""Where the read-only shared data lives, and a clean skip when it does not.

``HPCRUN_SHARED_DATA`` (a ``.../shared/data`` folder) wins; otherwise ``/work/shared/data`` next to the
checkout (``Path(__file__).resolve().parents[2] / "shared" / "data"``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

ENV = "HPCRUN_SHARED_DATA"


def shared_data_root() -> Optional[Path]:
    """The shared data folder, or None when it is absent."""
    env = os.environ.get(ENV)
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return root if root.is_dir() else None


def shared_data(sub: str = "") -> Path:
    """``<shared data>/sub``; skip the calling test with the reason when it is absent."""
    root = shared_data_root()
    where = os.environ.get(ENV) or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    if root is None:
        pytest.skip(f"shared data not found at {where} (set {ENV} to a shared/data folder); "
                    "../shared is only present in the project's CI and developer checkouts")
    path = root / sub
    if not path.exists():
        pytest.skip(f"{path} is absent from the shared data")
    return path
