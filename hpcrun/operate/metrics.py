"""A metrics file in the Prometheus text format, rewritten by the supervisor after every round.

Sites already run a node exporter (its textfile collector reads ``*.prom`` files) or a
Prometheus that can scrape a file server; a file costs hpcrun no server and no port. It
is replaced atomically (temporary name, fsync, rename in the same directory), which is
atomic on Lustre, GPFS and NFS too, so a scraper never reads half a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

Sample = Tuple[Mapping[str, str], float]


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass
class Family:
    """One metric: its name, help, type and samples."""

    name: str
    help: str
    kind: str = "gauge"
    samples: List[Sample] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> Family:
        self.samples.append((labels, value))
        return self

    def samples_from(self, values: Mapping[str, float], label: str) -> Family:
        for key, value in values.items():
            self.samples.append(({label: key}, value))
        return self

    def lines(self, common: Mapping[str, str]) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in self.samples:
            every = {**common, **labels}
            text = ",".join(f'{k}="{escape_label(v)}"' for k, v in every.items())
            yield f"{self.name}{{{text}}} {_number(value)}"


def render(families: Iterable[Family], common: Optional[Dict[str, str]] = None) -> str:
    return "".join(line + "\n" for fam in families for line in fam.lines(common or {}))


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
