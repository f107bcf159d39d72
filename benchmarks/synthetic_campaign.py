"""A campaign of N inputs planned away from the data, shared by the submit and status benchmarks.

The list file names N files that do not exist (``PATH 1GB 2000`` per line, checksums off), as
production plans are made; each input is one plan job for the shipped ``local-test`` profile.
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_plan(work: Path, name: str, n: int, array: str) -> Path:
    """Plan ``name`` with ``n`` jobs into ``work/<name>.plan``; ``array``: jobs.array (always, never, auto)."""
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan

    lst = work / f"{name}.list"
    with lst.open("w") as f:
        for i in range(n):
            f.write(f"/hpcrun-bench-nonexistent/raw/f{i:07d}.raw 1GB 2000\n")
    spec = work / f"{name}.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: {name}
        site: {{profile: local-test}}
        walltime: 10m
        inputs: {{list_file: {lst}, checksum: none}}
        jobs: {{files_per_job: 1, chains_per_node: 1, array: {array}}}
        chain: {{command: [/bin/true, "{{input}}"]}}
        outputs: {{location: {work}/out, pattern: "{{stem}}.out"}}
        """))
    return write_plan(load_plan(spec), work / f"{name}.plan").out_dir
