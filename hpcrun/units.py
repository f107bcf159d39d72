"""Strict parsing and formatting of sizes and durations.

Sizes follow the DataWarp/Slurm burst-buffer convention, so what a user writes in
YAML means what Slurm will read: ``KB, MB, GB, TB, PB`` are powers of 1000;
``KiB ... PiB`` and the bare letters ``K, M, G, T, P`` are powers of 1024; a bare
number is bytes. Emitted capacities are always integers with a unit, because
Slurm parses ``3.5TB`` as 3 bytes.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Union

_DEC = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
_BIN = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
UNITS: dict[str, int] = dict(_DEC)
for _k, _v in _BIN.items():
    UNITS[_k] = _v
    UNITS[_k + "IB"] = _v

SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGTP]i?B?|B)?\s*$"
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
VALID_SIZE_HELP = (
    "a whole number of bytes or a number with a unit: B, KB/MB/GB/TB/PB (powers of 1000) "
    "or KiB/MiB/GiB/TiB/PiB and K/M/G/T/P (powers of 1024), e.g. 500GB or 2TiB"
)


class UnitError(ValueError):
    """A size or duration that could not be parsed; the message says what is valid."""


def parse_size(value: Union[str, int, float]) -> int:
    """Return a size in bytes; reject anything ambiguous (negative, unknown unit)."""
    if isinstance(value, bool):
        raise UnitError(f"expected a size, got {value!r}; use {VALID_SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"a size cannot be negative ({value})")
        return value
    if isinstance(value, float):
        raise UnitError(f"{value!r} has no unit; use {VALID_SIZE_HELP}")
    if not isinstance(value, str):
        raise UnitError(f"expected a size, got {type(value).__name__}; use {VALID_SIZE_HELP}")
    m = _SIZE_RE.match(value)
    if not m:
        raise UnitError(f"{value!r} is not a size; use {VALID_SIZE_HELP}")
    number, unit = m.group(1), m.group(2).upper()
    if unit == "":
        unit = "B"
    if unit not in UNITS:
        raise UnitError(f"unknown unit {m.group(2)!r} in {value!r}; use {VALID_SIZE_HELP}")
    if "." in number:
        if unit == "B":
            raise UnitError(f"{value!r} is not a whole number of bytes")
        return int(math.ceil(float(number) * UNITS[unit]))
    return int(number) * UNITS[unit]


_COUNT = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}
COUNT_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[KMGkmg]?\s*$"
VALID_COUNT_HELP = ("a whole number, or a number with K, M or G (powers of 1000, as quotas on files are given: "
                    "10M is 10,000,000), e.g. 500K or 10M")


def parse_count(value: Union[str, int, float]) -> int:
    """A count of things (files, inodes): a whole number or one with K, M or G, decimal as sites give quotas."""
    if isinstance(value, bool) or isinstance(value, float) or not isinstance(value, (int, str)):
        raise UnitError(f"expected a count, got {value!r}; use {VALID_COUNT_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"a count cannot be negative ({value})")
        return value
    m = _SIZE_RE.match(value)
    if not m or m.group(2).upper() not in _COUNT:
        raise UnitError(f"{value!r} is not a count; use {VALID_COUNT_HELP}")
    number, mult = m.group(1), _COUNT[m.group(2).upper()]
    if "." in number and mult == 1:
        raise UnitError(f"{value!r} is not a whole number")
    return int(math.ceil(float(number) * mult)) if "." in number else int(number) * mult


def format_count(n: int) -> str:
    """A count for summaries, as sites give quotas: 812, 51.2 K, 2.1 M, 10 M."""
    if abs(n) < 1000:
        return str(n)
    for letter, mult in (("K", 10**3), ("M", 10**6), ("G", 10**9)):
        text = f"{n / mult:.1f}"
        if abs(float(text)) < 1000 or letter == "G":
            return (text[:-2] if text.endswith(".0") else text) + f" {letter}"
    raise AssertionError("unreachable")


def format_bytes(nbytes: int) -> str:
    """Bytes for summaries in the units sites give quotas in (powers of 1000): 3.4 TB, 20 TB."""
    return format_size(nbytes, binary=False).replace(".0 ", " ")


def format_size(nbytes: int, binary: bool = True) -> str:
    """Human-readable size for summaries (may have a decimal; never for directives)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if binary else ["B", "KB", "MB", "GB", "TB", "PB"]
    base = 1024.0 if binary else 1000.0
    value = float(nbytes)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= base
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=1024)
def format_capacity(nbytes: int) -> str:
    """Integer-with-unit capacity for ``#DW``/``#BB`` lines (``3500GB``, ``80GiB``).

    The largest unit that divides the value exactly is chosen, so the text is exact.
    Cached: a 100k-job plan asks for the same few capacities 200k times.
    """
    if nbytes <= 0:
        raise UnitError("a burst-buffer capacity must be positive")
    best = f"{nbytes}B"
    best_number = nbytes
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "KB", "MB", "GB", "TB", "PB"):
        mult = UNITS[unit.upper()]
        if nbytes % mult == 0 and nbytes // mult < best_number:
            best, best_number = f"{nbytes // mult}{unit}", nbytes // mult
    return best


def format_binary_suffix(nbytes: int) -> str:
    """Size for Shifter ``perNodeCache=size=`` (powers of 1024, single letter, rounded up)."""
    for letter, mult in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= mult:
            return f"{math.ceil(nbytes / mult)}{letter}"
    return f"{max(nbytes, 1)}b"


def round_up(nbytes: int, granularity: int) -> int:
    """Round up to a multiple of the pool granularity, as Slurm does."""
    if granularity <= 1:
        return nbytes
    return -(-nbytes // granularity) * granularity


_DUR_COLON = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_DUR_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)\s*$", re.IGNORECASE)
VALID_DURATION_HELP = (
    "quoted Slurm time syntax (MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) or a number with "
    "a unit s, m, h or d (e.g. 90s, 30m, 12h)"
)


def parse_duration(value: Union[str, int]) -> int:
    """Return seconds from text with a unit or Slurm's colon syntax.

    Bare numbers are refused: ``300`` could mean seconds or minutes, and YAML reads an
    unquoted ``8:00:00`` as the base-60 integer 28800.
    """
    if isinstance(value, bool):
        raise UnitError(f"expected a duration; use {VALID_DURATION_HELP}")
    if isinstance(value, int):
        raise UnitError(f"{value} has no unit; write e.g. '{value}s' or '{value}m', and quote "
                        "colon times ('08:00:00': YAML reads an unquoted 8:00:00 as a number)")
    if not isinstance(value, str):
        raise UnitError(f"expected a duration; use {VALID_DURATION_HELP}")
    text = value.strip()
    if text.isdigit():
        raise UnitError(f"'{text}' has no unit; write e.g. '{text}s' or '{text}m'")
    m = _DUR_UNIT.match(text)
    if m:
        mult = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[m.group(2).lower()]
        seconds = int(math.ceil(float(m.group(1)) * mult))
    else:
        m = _DUR_COLON.match(text)
        if not m:
            raise UnitError(f"{value!r} is not a duration; use {VALID_DURATION_HELP}")
        days, a, b, c = m.groups()
        d = int(days) if days else 0
        if days is not None:  # D-HH[:MM[:SS]]
            h, mi, s = int(a), int(b or 0), int(c or 0)
        elif c is not None:  # HH:MM:SS
            h, mi, s = int(a), int(b), int(c)
        else:  # MM:SS (a bare MM was refused above)
            h, mi, s = 0, int(a), int(b)
        if mi >= 60 and (days is not None or c is not None) or s >= 60:
            raise UnitError(f"{value!r} has minutes or seconds >= 60")
        seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds <= 0:
        raise UnitError("a duration must be positive")
    return seconds


def format_duration(seconds: int) -> str:
    """Slurm ``--time`` text: ``D-HH:MM:SS`` or ``HH:MM:SS``."""
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"
