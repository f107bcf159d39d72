"""Sarus (CSCS): ``sarus run`` of a pulled image, host paths bound with ``--mount``.

Sarus passes the host environment into the container, so the job's HPCRUN_* variables
reach each task; its ``--mount`` value is a comma-separated ``key=value`` list, so a bind
path holding a comma cannot be carried and is refused at plan time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Tuple

from hpcrun.backends.container.base import Runtime, RuntimeProblem, register
from hpcrun.shell import Shell, quote


@register
@dataclass
class Sarus(Runtime):
    name: ClassVar[str] = "sarus"

    def prefix(self) -> Shell:
        settings = self.site_settings()
        words: List[str] = [quote(settings.command), "run"]
        words += [quote(o) for o in settings.run_options]
        words += [quote(o) for o in self.spec.options]
        for bind in self.binds:
            mount = f"--mount=type=bind,source={bind.source},destination={bind.target}"
            words.append(mount + (",readonly" if bind.read_only else ""))
        words.append(quote(self.spec.image))
        return Shell(" ".join(words))

    def problems(self) -> Tuple[List[RuntimeProblem], List[str]]:
        found = []
        for bind in self.binds:
            if bind.path is not None and "," in bind.path:
                where, path = (str(bind.origin[0]), tuple(bind.origin[1:])) if bind.origin and \
                    bind.origin[0] in ("spec", "profile") else ("spec", ("container", "image"))
                found.append(RuntimeProblem(where, path, (
                    f"'{bind.path}' holds a comma, which Sarus's --mount option cannot carry (it "
                    "separates the mount's key=value fields); use a path without one")))
        return found, []
