"""The I/O engine room: what a sweep asks of a benchmark program, and the registry of them.

An engine turns a sweep point into the runs (steps) that measure it, says how its binary is
found and whether it is here (``--engine auto`` takes the first registered engine that is),
what it cannot do, and reads its output back into measurements.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, ClassVar, Dict, List, Optional, Tuple, Type

from hpcrun.iotune.points import Measurement, Point, Step, SweepShape
from hpcrun.model.site import SiteProfile

DarshanEnv = Callable[[str, bool], Tuple[Tuple[Tuple[str, str], ...], str]]   # (step name, mpi) -> env, log


class Engine(ABC):
    """One benchmark program."""

    name: ClassVar[str] = ""
    binary_key: ClassVar[str] = ""     # the profile key naming its binary (for messages)
    mpi: ClassVar[bool] = False        # runs as ranks under the launcher (IOR), or as one process group
    absent: ClassVar[str] = ""         # when auto passes it over, in words (for messages)

    @abstractmethod
    def binary(self, profile: SiteProfile) -> str:
        """The program to run, from the profile."""

    def present(self, profile: SiteProfile) -> bool:
        """Whether ``--engine auto`` may choose it on this site."""
        return bool(shutil.which(self.binary(profile)))

    def check_sweep(self, sweep: SweepShape) -> None:
        """Raise ValueError when the sweep asks what this engine cannot measure."""
        return None

    def path_problem(self, path: str) -> str:
        """Why a target directory cannot be given to this engine, or ''."""
        return ""

    def local_problem(self, profile: SiteProfile) -> str:
        """Why ``--local`` cannot run this engine here (beyond its binary), or ''."""
        return ""

    @abstractmethod
    def steps(self, sweep: SweepShape, point: Point, binary: str, darshan: Optional[DarshanEnv]) -> List[Step]:
        """The runs that measure one point."""

    @abstractmethod
    def version_argv(self, binary: str) -> List[str]:
        """The command that prints the engine's version."""

    @abstractmethod
    def version(self, text: str) -> str:
        """The version, from what ``version_argv`` printed."""

    @abstractmethod
    def measure(self, result: Path, operations: List[str], operation: str) -> Tuple[Measurement, Optional[str]]:
        """One step's measurement of ``operation`` from its result file, and the version it names."""

    def combine(self, parts: List[Measurement]) -> Measurement:
        """The point's measurement from its steps' (one step per point unless overridden)."""
        return parts[0]


_REGISTRY: Dict[str, Engine] = {}


def register(cls: Type[Engine]) -> Type[Engine]:
    """Class decorator: make an engine known by its ``name`` (registration order is auto's preference)."""
    _REGISTRY[cls.name] = cls()
    return cls


def registered() -> Dict[str, Engine]:
    return dict(_REGISTRY)
