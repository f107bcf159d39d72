"""The sweep model: what to measure. Presets (``iobench/*.yaml``) and command-line options
both become a :class:`Sweep`; targets stay symbolic here (the planner resolves them against
the site profile).
"""

from __future__ import annotations

import math
from functools import reduce
from typing import TYPE_CHECKING, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hpcrun.iotune.engines import engine_for, names
from hpcrun.model.fields import Duration, Line, Name, Size
from hpcrun.model.spec import ContainerSpec

if TYPE_CHECKING:
    EngineChoice = str
else:
    EngineChoice = Literal[tuple(["auto", *names()])]   # from the engine registry

SYMBOLIC_TARGETS = ("bb", "scratch", "node-local")
API = Literal["posix", "mpiio", "hdf5"]
MIN_BLOCK = 16 * 2**20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


def check_target(value: str) -> str:
    """``bb``, ``scratch``, ``node-local`` or an absolute path (one line, no NUL)."""
    if value in SYMBOLIC_TARGETS:
        return value
    if not value.startswith("/"):
        raise ValueError(f"target '{value}' is not one of {', '.join(SYMBOLIC_TARGETS)} nor an "
                         "absolute path (starting with '/')")
    if any(c in value for c in "\n\r\0"):
        raise ValueError("a target path cannot contain a newline or NUL byte")
    return value


class Sweep(Strict):
    """One I/O sweep: every combination of the lists below is one point."""

    name: Name = Field("sweep", description="label of the sweep (results, history, job name)")
    description: Optional[str] = None
    transfer_sizes: List[Size] = Field(min_length=1, description="bytes per I/O call (IOR -t, fio bs)")
    block_sizes: List[Size] = Field(default_factory=list, description=(
        "bytes per writer (IOR -b, fio size); default: one block, 4 x the largest transfer size "
        "rounded up to a common multiple of all transfer sizes, at least 16 MiB"))
    writers: List[int] = Field(default_factory=lambda: [1], min_length=1,
                               description="writers (processes) per node")
    nodes: List[int] = Field(default_factory=lambda: [1], min_length=1, description="nodes")
    apis: List[API] = Field(default_factory=lambda: ["posix"], min_length=1,  # type: ignore[arg-type]
                            description="I/O interface (IOR -a); fio measures posix only")
    layout: Literal["file-per-process", "shared-file"] = "file-per-process"
    targets: List[Line] = Field(default_factory=lambda: ["scratch"], min_length=1, description=(
        "bb (the job's burst buffer), scratch, node-local, or an absolute path"))
    reps: int = Field(1, ge=1, le=100, description="repetitions of each point")
    operations: List[Literal["write", "read"]] = Field(
        default_factory=lambda: ["write", "read"], min_length=1,  # type: ignore[arg-type]
        description="write and/or read (read follows write when both run)")
    engine: EngineChoice = "auto"
    darshan: bool = Field(False, description="run every point under Darshan (LD_PRELOAD)")
    direct: bool = Field(False, description="O_DIRECT (fio direct=1, IOR --posix.odirect)")
    walltime: Duration = Field(1800, description="time limit of the sweep job")
    partition: Optional[Name] = Field(None, description="partition (default: the profile's)")
    container: ContainerSpec = Field(default_factory=ContainerSpec)

    @field_validator("transfer_sizes")
    @classmethod
    def _transfers(cls, value: List[int]) -> List[int]:
        for t in value:
            if t <= 0 or t % 8:
                raise ValueError(f"transfer size {t} bytes is not a positive multiple of 8 bytes "
                                 "(IOR's unit); use e.g. 64k, 1m, 4m")
        if len(set(value)) != len(value):
            raise ValueError("a transfer size is listed twice")
        return value

    @field_validator("block_sizes")
    @classmethod
    def _blocks(cls, value: List[int]) -> List[int]:
        if any(b <= 0 for b in value):
            raise ValueError("block sizes must be positive")
        if len(set(value)) != len(value):
            raise ValueError("a block size is listed twice")
        return value

    @field_validator("writers", "nodes")
    @classmethod
    def _counts(cls, value: List[int]) -> List[int]:
        if any(isinstance(v, bool) or v < 1 for v in value):
            raise ValueError("every value must be a whole number >= 1")
        if len(set(value)) != len(value):
            raise ValueError("a value is listed twice")
        return value

    @field_validator("apis", "operations")
    @classmethod
    def _unique(cls, value: List[str]) -> List[str]:
        if len(set(value)) != len(value):
            raise ValueError("a value is listed twice")
        return value

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: List[str]) -> List[str]:
        out = [check_target(v) for v in value]
        if len(set(out)) != len(out):
            raise ValueError("a target is listed twice")
        return out

    @model_validator(mode="after")
    def _sizes_fit(self) -> Sweep:
        for b in self.block_sizes:
            bad = [t for t in self.transfer_sizes if b < t or b % t]
            if bad:
                raise ValueError(f"block size {b} bytes is not a multiple of transfer size {bad[0]} "
                                 "bytes; every block size must be a multiple of every transfer size "
                                 "(IOR refuses otherwise)")
        if self.engine != "auto":
            engine_for(self.engine).check_sweep(self)
        return self

    def blocks(self) -> List[int]:
        """The block sizes to use (the default is computed from the transfer sizes)."""
        if self.block_sizes:
            return list(self.block_sizes)
        return [default_block(self.transfer_sizes)]


def default_block(transfers: List[int]) -> int:
    common = reduce(lambda a, b: a * b // math.gcd(a, b), transfers)
    want = max(4 * max(transfers), MIN_BLOCK)
    return -(-want // common) * common
