"""docs/architecture.md's tree names exactly the package's folders: a room added, moved or removed
without its line in the tree fails here (and the docs keep answering "where does my change go")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"


def tree_block(text: str) -> List[str]:
    """The fenced block under '## The tree'."""
    section = text.split("## The tree", 1)[1]
    return section.split("```", 2)[1].splitlines()


def folders_named(lines: List[str]) -> Set[str]:
    """Folder paths under hpcrun/ named in the tree, by indentation (two spaces a level)."""
    stack: List[str] = []
    out: Set[str] = set()
    for line in lines:
        m = re.match(r"^( *)([A-Za-z_][\w-]*)/(?:\s|$)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [m.group(2)]
        if stack[0] == "hpcrun" and depth > 0:
            out.add("/".join(stack[1:]))
    return out


def package_folders() -> Set[str]:
    root = REPO / "hpcrun"
    return {str(p.parent.relative_to(root)) for p in root.rglob("__init__.py") if p.parent != root}


def test_the_tree_names_every_folder_of_the_package_and_no_other() -> None:
    named = folders_named(tree_block(DOC.read_text(encoding="utf-8")))
    actual = package_folders()
    assert named == actual, (f"in the package, not in docs/architecture.md's tree: {sorted(actual - named)}; "
                             f"in the tree, not in the package: {sorted(named - actual)}")


def test_the_reader_sees_nesting() -> None:
    lines = ["hpcrun/", "  operate/        x", "    tracking/    y", "  plan/", "    job/", "templates/   z"]
    assert folders_named(lines) == {"operate", "operate/tracking", "plan", "plan/job"}


def test_where_does_my_change_go_answers_the_five_common_changes() -> None:
    text = DOC.read_text(encoding="utf-8").split("## Where does my change go", 1)[1]
    for change in ("A retry class", "A scheduler outage mode", "A profile key", "A new column in the report",
                   "A new store query"):
        assert f"**{change}**" in text, change
    for path in re.findall(r"`((?:backends|model|plan|render|store|operate|report|iotune)/[\w/]+\.py)`", text):
        assert (REPO / "hpcrun" / path).is_file(), f"docs/architecture.md names {path}, which does not exist"
