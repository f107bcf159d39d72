"""A large list file's inputs, never held: read once to check them, then again block by block.

A plan of 10^6 inputs held as Python objects costs ~700 bytes an input (a 1M-input plan: ~800 MB).
Above ``STREAM_ABOVE_BYTES`` a list file that the usual campaign reads (one input per job, paths and
sizes on every line, no checksum to compute here, no burst buffer) is scanned once in blocks: every line checked as
the whole-file reading checks it, the totals summed, each stem's 64-bit hash kept (8 bytes an input)
to prove the stems unique. The plan then holds only where each block starts; the jobs are made
again from the file, a block at a time, whenever the renderer reads them. Anything the quick checks
cannot vouch for (mixed lines, URLs, a repeated stem, a hash collision) goes to the whole-file
reading, which finds and names it; a block with a bad line is reported at that line, and the scan
goes on to the end so that every bad line is named at once.
"""

from __future__ import annotations

import bisect
import os
import stat
from array import array
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import repeat
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union, overload

from hpcrun.errors import HpcrunError, InputError, Problem
from hpcrun.model.spec import Campaign
from hpcrun.model.textfile import MiB
from hpcrun.model.yamlsrc import Located
from hpcrun.plan.checks import CONTROL
from hpcrun.plan.intake import placeholders as ph
from hpcrun.plan.intake.inputs import InputItem, item_columns, list_path, parent_dir, parse_sizes, read_list, stems_of
from hpcrun.plan.values import Job, StreamedJobs

STREAM_ABOVE_BYTES = MiB       # ~13k lines: a list file that fits one block is read whole
BLOCK_BYTES = MiB              # one block of lines (~13k of 80 bytes): read, made into jobs, dropped
BAD, UNUSUAL = -1, -2           # a block with a line that may be bad; a block fine but not of the usual kind
_BOUNDS = [(k << 56) - (1 << 63) for k in range(1, 256)]   # the 256 buckets of signed 64-bit hashes


@dataclass(frozen=True)
class Span:
    """One block of the list file: its bytes, and the inputs (jobs) it holds."""
    offset: int
    length: int
    first: int        # index of its first input
    count: int


class _Hashes:
    """64-bit hashes that must all differ, kept in arrays (8 bytes each) split into 256 buckets by
    value, so that the final check needs a set of one bucket at a time, not of 10^6 integers."""

    def __init__(self) -> None:
        self.buckets = [array("q") for _ in range(256)]

    def add(self, values: List[int]) -> None:
        values.sort()
        lo = 0
        for k, bound in enumerate(_BOUNDS):
            hi = bisect.bisect_left(values, bound, lo)
            self.buckets[k].extend(values[lo:hi])
            lo = hi
        self.buckets[255].extend(values[lo:])

    def distinct(self) -> bool:
        return all(len(set(b)) == len(b) for b in self.buckets)


@dataclass
class _Scan:
    """What the scan sums and keeps while it reads."""
    spans: List[Span] = field(default_factory=list)
    width: Optional[int] = None
    sizes: Dict[str, int] = field(default_factory=dict)
    heads: Set[str] = field(default_factory=set)
    input_bytes: int = 0
    events: Optional[int] = 0
    count: int = 0
    problems: List[Problem] = field(default_factory=list)


def streamable(campaign: Campaign) -> bool:
    """The campaigns whose jobs can be made from a list file block by block: one input per job, a fixed
    number of chains, nothing per input that needs all inputs at once (checksums from a catalog or
    computed here, buffer sizes, the common part of the paths, the nodes' caches)."""
    c, js = campaign.inputs, campaign.jobs
    return (bool(c.list_file) and not c.files and not c.glob and not c.checksum_catalog and c.stem != "path"
            and js.files_per_job == 1 and js.chains_per_node != "auto" and campaign.burst_buffer is None
            and js.locality != "prefer")


def scan(campaign: Campaign, src: Located, spec_dir: Path) -> Optional[Listed]:
    """The list file's inputs as a :class:`Listed` when the file is large and every line is of the
    usual kind; None sends the caller to the whole-file reading. Bad lines raise InputError."""
    if not streamable(campaign):
        return None
    file = list_path(campaign.inputs.list_file or "", spec_dir)
    try:
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size <= STREAM_ABOVE_BYTES:
                return None
            state = _Scan()
            hashes = _Hashes()
            outs = None if ph.stem_only(campaign.outputs.pattern) else _Hashes()
            ok = _scan_blocks(f, file, campaign, state, hashes, outs)
    except OSError:
        return None   # the whole-file reading says why, at inputs.list_file
    if state.problems:
        raise InputError(state.problems)
    if not ok or not state.count or not hashes.distinct() or (outs is not None and not outs.distinct()):
        return None
    if campaign.inputs.checksum != "none" and any(os.path.isdir(parent_dir(h)) for h in state.heads):
        return None   # planned where the inputs are: their checksums are computed, input by input
    return Listed(file, (st.st_size, st.st_mtime_ns), tuple(state.spans), state.count, state.width or 2,
                  campaign.inputs.events, campaign.inputs.stem, state.input_bytes, state.events,
                  frozenset(state.heads))


def _scan_blocks(f, file: str, campaign: Campaign, state: _Scan, hashes: _Hashes, outs: Optional[_Hashes]) -> bool:
    """Read the blocks in turn; False as soon as one is not of the usual kind (and has no bad line)."""
    offset, line = 0, 1
    while True:
        raw = f.readlines(BLOCK_BYTES)
        if not raw:
            return True
        data = b"".join(raw)
        text = _decoded(data, file, line, state.problems)
        lines = text.splitlines() if text is not None else []
        count = BAD if text is None else _check_block(lines, campaign, state, hashes, outs)
        if count == BAD and text is not None:
            before = len(state.problems)
            read_list(file, lines, state.problems, first_line=line)   # names the bad lines
            count = UNUSUAL if len(state.problems) == before else BAD
        if count == UNUSUAL and not state.problems:
            return False
        if count >= 0 and not state.problems:
            state.spans.append(Span(offset, len(data), state.count - count, count))
        offset += len(data)
        line += len(lines)


def _decoded(data: bytes, file: str, line: int, problems: List[Problem]) -> Optional[str]:
    """The block's text; None after a problem at the line of a NUL or a byte that is not UTF-8."""
    nul = data.find(b"\0")
    if nul >= 0:
        problems.append(Problem(file, line + data.count(b"\n", 0, nul), "",
                                "cannot read the list file: it contains a NUL byte: this is a binary file, not text"))
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(Problem(file, line + data.count(b"\n", 0, exc.start), "",
                                "cannot read the list file: it is not UTF-8 text (the first bad byte is on this line)"))
        return None


def _check_block(lines: List[str], campaign: Campaign, state: _Scan, hashes: _Hashes, outs: Optional[_Hashes]) -> int:
    """The number of inputs of a block of the usual kind (summed into ``state``); BAD when a line
    may be bad (the caller looks line by line), UNUSUAL when it is fine but not of the usual kind."""
    rows = [r for r in map(str.split, lines) if r and r[0][0] != "#"]
    if not rows:
        return 0
    widths = set(map(len, rows))
    if len(widths) != 1 or not widths <= {2, 3}:
        return BAD
    width = widths.pop()
    if state.width not in (None, width):
        return UNUSUAL
    state.width = width
    columns = list(zip(*rows))
    del rows
    paths = columns[0]
    joined = "\n" + "\n".join(paths)
    if joined.count("\n/") != len(paths) or "://" in joined:
        return BAD   # relative paths are bad lines; URLs are read the whole-file way
    if not parse_sizes(columns[1], state.sizes) or (width == 3 and not all(map(str.isdecimal, set(columns[2])))):
        return BAD
    stems = stems_of(paths, campaign.inputs.stem)
    if not all(stems) or CONTROL.search("".join(paths)) or CONTROL.search("".join(stems)):
        return UNUSUAL
    if outs is not None:
        names = ph.output_names(campaign.outputs.pattern, stems, paths)
        if {"", ".", ".."} & set(names) or CONTROL.search("".join(names)):
            return UNUSUAL
        outs.add(list(map(hash, names)))
    hashes.add(list(map(hash, stems)))
    state.heads.update({p[:p.rfind("/") + 1] for p in paths})
    state.input_bytes += sum(map(state.sizes.__getitem__, columns[1]))
    if state.events is not None:
        state.events = sum(map(int, columns[2])) + state.events if width == 3 else (
            None if campaign.inputs.events is None else state.events + campaign.inputs.events * len(paths))
    state.count += len(paths)
    return len(paths)


@dataclass(frozen=True, eq=False)
class Listed(Sequence[InputItem]):
    """A list file's inputs as the scan found them: where each block starts, and the totals. Read as a
    sequence, it reads the file again (each check that needs every input was made by the scan)."""
    file: str
    stamp: Tuple[int, int]            # (size, mtime) when scanned: a file changed since is refused
    spans: Tuple[Span, ...]
    total: int                        # inputs
    width: int
    default_events: Optional[int]
    stem_mode: str
    input_bytes: int
    events: Optional[int]             # the sum over all inputs, None when some input has none
    heads: frozenset                  # each input's path up to its last "/", once

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, i: int) -> InputItem: ...

    @overload
    def __getitem__(self, i: slice) -> List[InputItem]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[InputItem, List[InputItem]]:
        if isinstance(i, slice):
            return list(self)[i]
        k, at = self.block_of(range(self.total)[i])
        return self.block(k)[at]

    def __iter__(self) -> Iterator[InputItem]:
        for k in range(len(self.spans)):
            yield from self.block(k)

    @property
    def first_without_events(self) -> Optional[str]:
        """The path of an input whose events are unknown (the first), or None."""
        return None if self.events is not None else self[0].path

    @property
    def parents(self) -> Set[str]:
        """The distinct parent directories of the inputs."""
        return {parent_dir(h) for h in self.heads}

    @cached_property
    def firsts(self) -> List[int]:
        """Each block's first input, in order (what a position is looked up in)."""
        return [s.first for s in self.spans]

    def block_of(self, at: int) -> Tuple[int, int]:
        """(block, position in it) of input ``at``."""
        k = bisect.bisect_right(self.firsts, at) - 1
        return k, at - self.firsts[k]

    def block(self, k: int) -> List[InputItem]:
        """The inputs of block ``k``, read again (the file must not have changed)."""
        span = self.spans[k]
        with open(self.file, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) != self.stamp:
                raise HpcrunError(f"{self.file}: the list file changed while the plan was being made; "
                                  "plan again once it is complete")
            f.seek(span.offset)
            text = f.read(span.length).decode("utf-8")
        rows = [r for r in map(str.split, text.splitlines()) if r and r[0][0] != "#"]
        columns = list(zip(*rows)) if rows else [(), (), ()]
        del rows
        known: Dict[str, int] = {}
        parse_sizes(columns[1], known)
        return item_columns(columns, self.width, self.default_events, known, stems_of(columns[0], self.stem_mode))


class ListedJobs(StreamedJobs):
    """The one-input jobs of a :class:`Listed`, made a block at a time when read (a slice is a view)."""

    def __init__(self, listed: Listed, chains: int, named: str, pattern: str,
                 start: int = 0, stop: Optional[int] = None, cache: Optional[list] = None):
        self.listed, self.chains, self.named, self.pattern = listed, chains, named, pattern
        self.start, self.stop = start, listed.total if stop is None else stop
        self._cache: List[Any] = cache if cache is not None else [None, None]   # [block, its jobs], shared by views

    # what the plan's totals need, without reading the file again
    @property
    def input_count(self) -> int:
        return len(self)

    @property
    def input_bytes(self) -> int:
        assert self.start == 0 and self.stop == self.listed.total, "the totals are of the whole plan"
        return self.listed.input_bytes

    @property
    def chains_per_node(self) -> int:
        return self.chains

    @property
    def first_index(self) -> int:
        return self.start

    @property
    def last_index(self) -> int:
        return self.stop - 1

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, i: int) -> Job: ...

    @overload
    def __getitem__(self, i: slice) -> ListedJobs: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Job, ListedJobs]:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            assert step == 1, "a view of consecutive jobs"
            return ListedJobs(self.listed, self.chains, self.named, self.pattern,
                              self.start + lo, self.start + max(lo, hi), self._cache)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        k, at = self.listed.block_of(self.start + (i % n))
        return self._jobs(k)[at]

    def __iter__(self) -> Iterator[Job]:
        if self.start >= self.stop:
            return
        firsts = self.listed.firsts
        for block in range(self.listed.block_of(self.start)[0], len(firsts)):
            first = firsts[block]
            if first >= self.stop:
                return
            yield from self._jobs(block)[max(0, self.start - first):self.stop - first]

    def _jobs(self, k: int) -> List[Job]:
        if self._cache[0] != k:
            self._cache[:] = [None, None]   # the previous block's jobs freed before the next is made
            self._cache[:] = [k, one_input_jobs(self.listed.firsts[k], self.listed.block(k), self.pattern, self.chains,
                                                self.named)]
        jobs: List[Job] = self._cache[1]
        return jobs


def one_input_jobs(first: int, items: Sequence[InputItem], pattern: str, chains: int, named: str,
                   outputs: Optional[Sequence[str]] = None,
                   sums: Optional[Sequence[Optional[str]]] = None) -> List[Job]:
    """Jobs of one input each, numbered from ``first``, at C speed (zip of one iterable gives the
    one-element tuples); without checksums they share one ``(None,)`` (48 bytes a job at 10^6 jobs)."""
    if outputs is None:
        outputs = ph.output_names(pattern, [i.stem for i in items], [i.path for i in items])
    n = len(items)
    no_sums = sums is None or sums.count(None) == n
    return list(map(partial(tuple.__new__, Job), zip(
        range(first, first + n), map(named.__mod__, range(first + 1, first + n + 1)), zip(items), zip(outputs),
        repeat(chains), repeat(None), repeat(None), repeat((None,)) if no_sums else zip(sums or ()))))


__all__ = ["Listed", "ListedJobs", "STREAM_ABOVE_BYTES", "one_input_jobs", "scan",
           "streamable"]
