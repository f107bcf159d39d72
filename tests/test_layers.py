"""The package's layers, its rooms and their import graph: data flows one way, and no module reaches back up.

load (model) -> validate -> plan -> render -> operate -> store -> report, with the backends
at the bottom (the models derive their lists of kinds from the backends' registries) and the
command line on top. Every ``import`` in the package is read from the source, those under
``if TYPE_CHECKING:`` included (a type is a dependency of the design):

* layers and independent rooms: every import, module-level or inside a function;
* the sub-rooms of a folder (``ROOMS``), bottom first: the same, but for the late references
  named in ``LATE`` (an import inside a function, each with its reason);
* cycles: module-level imports (``TYPE_CHECKING`` ones included); an import inside a function is
  the one way to break a cycle, so it does not count.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PKG = Path(__file__).resolve().parents[1] / "hpcrun"

# Bottom first. A module may import its own layer and every layer below it.
LAYERS: List[Tuple[str, ...]] = [
    ("hpcrun", "hpcrun.errors", "hpcrun.units", "hpcrun.shell", "hpcrun.resources", "hpcrun.bulk"),
    ("hpcrun.backends",),
    ("hpcrun.model",),
    ("hpcrun.plan",),
    ("hpcrun.render",),
    ("hpcrun.store",),
    ("hpcrun.operate",),
    ("hpcrun.report", "hpcrun.iotune"),
    ("hpcrun.api",),
    ("hpcrun.cli", "hpcrun.__main__"),
]
# `import hpcrun; hpcrun.plan(...)`: the package root hands out the API lazily (PEP 562)
ALLOWED_UPWARD = {("hpcrun", "hpcrun.api")}
# Rooms in one layer that must not import each other.
INDEPENDENT: List[Tuple[str, ...]] = [
    ("hpcrun.backends.scheduler", "hpcrun.backends.container", "hpcrun.backends.burstbuffer"),
    # late binding wraps a scheduler (it imports scheduler.base); it knows no runtime or buffer system
    ("hpcrun.backends.late", "hpcrun.backends.container", "hpcrun.backends.burstbuffer"),
    ("hpcrun.report", "hpcrun.iotune"),
]
# The rooms inside a folder, bottom first: a unit (a module or a sub-package) imports only units at or
# below its own place. Every module of the folder belongs to one unit, so a new module or sub-room
# must be placed here.
ROOMS: Dict[str, List[str]] = {
    "hpcrun.operate": ["manifest", "results", "metrics", "plandir", "campaign", "outputs", "submission",
                       "tracking", "retries", "supervision"],
    "hpcrun.plan": ["intake", "checks", "site", "values", "footprint", "job", "budget", "build", "load"],
    "hpcrun.store": ["sql", "records", "outage", "locking", "base", "queries", "rows", "store"],
    "hpcrun.iotune": ["points", "readers", "engines", "sweeps", "advice", "apply", "history", "plot", "collect"],
}
# Late references up the room order: (importer, imported) -> why (an import inside a function only).
LATE = {
    ("hpcrun.operate.submission.submit", "hpcrun.operate.tracking.track"):
        "submit polls once before it sends the finalize job, so its dependency names the jobs still queued",
}
FOLDER_MODULES_MAX = 15
ROOT_MODULES_MAX = 8
MODULE_LINES_MAX = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, module_level: bool = False) -> List[Tuple[str, int]]:
    """Every hpcrun module ``path`` imports, with its line (``module_level``: not those inside a function)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    return _imports_in(ast.parse(path.read_text(), str(path)), package, module_level)


def _imports_in(tree: ast.AST, package: str, module_level: bool) -> List[Tuple[str, int]]:
    found = []
    for node in (_module_level_nodes(tree) if module_level else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "hpcrun"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hpcrun":
                continue
            found.append((target, node.lineno))
            found += [(f"{target}.{a.name}", node.lineno) for a in node.names]
    return found


def _module_level_nodes(tree: ast.AST) -> List[ast.AST]:
    """Every node outside function bodies (``if TYPE_CHECKING:`` blocks and class bodies included)."""
    out: List[ast.AST] = []
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _modules() -> Dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _layer(module: str) -> int:
    best, depth = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > depth:
                best, depth = i, len(name)
    if module == "hpcrun":
        return 0
    return best


def _graph() -> Dict[str, Set[str]]:
    """Module -> the modules it imports at module level (``TYPE_CHECKING`` blocks included)."""
    mods = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in mods.items():
        graph[name] = {t for t, _ in imports_of(path, module_level=True) if t in mods and t != name}
    return graph


def test_every_module_has_a_layer() -> None:
    missing = [m for m in _modules() if _layer(m) < 0]
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_no_module_imports_a_higher_layer() -> None:
    mods = _modules()
    bad = []
    for name, path in sorted(mods.items()):
        for target, line in imports_of(path):
            if target in mods and _layer(target) > _layer(name) and (name, target) not in ALLOWED_UPWARD:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {name} imports {target} (a higher layer)")
    assert not bad, "\n".join(bad)


def test_independent_rooms_do_not_import_each_other() -> None:
    mods = _modules()
    bad = []
    for rooms in INDEPENDENT:
        def room(m: str, rooms: Tuple[str, ...] = rooms) -> str:
            return next((r for r in rooms if m == r or m.startswith(r + ".")), "")
        for name, path in sorted(mods.items()):
            mine = room(name)
            for target, line in imports_of(path):
                theirs = room(target)
                if mine and theirs and mine != theirs and target in mods:
                    bad.append(f"{path.relative_to(PKG.parent)}:{line}: {name} imports {target}")
    assert not bad, "\n".join(bad)


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One import cycle, or [] (iterative depth-first search)."""
    state: Dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return []


def test_no_import_cycles() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its own modules is not a cycle of design
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_type_checking_imports_count_and_function_imports_only_outside_cycles() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hpcrun.cli\n"
                     "else:\n    import hpcrun.units\nimport hpcrun.errors\ndef f():\n    import hpcrun.api\n")
    assert {t for t, _ in _imports_in(tree, "hpcrun", True)} == {"hpcrun.cli", "hpcrun.units", "hpcrun.errors"}
    assert {t for t, _ in _imports_in(tree, "hpcrun", False)} == {"hpcrun.cli", "hpcrun.units", "hpcrun.errors",
                                                                   "hpcrun.api"}


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def _unit(folder: str, module: str) -> str:
    """The unit of ``folder``'s room order that holds ``module`` ('' for none)."""
    rest = module[len(folder) + 1:].split(".")[0] if module.startswith(folder + ".") else ""
    return rest if rest in ROOMS[folder] else ("" if not rest else "?" + rest)


def test_every_module_of_a_folder_with_rooms_has_its_room() -> None:
    missing = sorted(m for m in _modules() for folder in ROOMS if _unit(folder, m).startswith("?"))
    assert not missing, f"modules outside the room order of their folder (place them in ROOMS): {missing}"


def _room_violations(imports: Dict[str, List[Tuple[str, int]]]) -> List[str]:
    bad = []
    for folder, order in ROOMS.items():
        for name, found in sorted(imports.items()):
            mine = _unit(folder, name)
            if not mine or mine.startswith("?"):
                continue
            for target, line in found:
                theirs = _unit(folder, target)
                if theirs and not theirs.startswith("?") and order.index(theirs) > order.index(mine) \
                        and (name, target) not in LATE:
                    bad.append(f"{name}:{line} ({folder} room {mine}) imports {target} (room {theirs}, above it)")
    return bad


def test_rooms_import_only_rooms_below_them() -> None:
    mods = _modules()
    imports = {name: [(t, line) for t, line in imports_of(path) if t in mods] for name, path in mods.items()}
    bad = _room_violations(imports)
    assert not bad, "\n".join(bad)


def test_late_references_are_inside_functions_and_still_needed() -> None:
    mods = _modules()
    for importer, imported in LATE:
        every = {t for t, _ in imports_of(mods[importer])}
        top = {t for t, _ in imports_of(mods[importer], module_level=True)}
        assert imported in every, f"{importer} no longer imports {imported}: drop it from LATE"
        assert imported not in top, f"{importer} imports {imported} at module level: that is a dependency, not late"


def test_room_order_finds_an_upward_import() -> None:
    """The check itself: submission importing tracking at module level, or campaign importing submission."""
    assert _room_violations({"hpcrun.operate.campaign.generations": [("hpcrun.operate.submission.batches", 1)]})
    assert not _room_violations({"hpcrun.operate.submission.batches": [("hpcrun.operate.campaign.generations", 1)]})


def test_no_cycle_through_a_type_checking_import() -> None:
    """A cycle closed by an import under ``if TYPE_CHECKING:`` is a cycle (a type is a dependency)."""
    graph = _graph()
    graph["hpcrun.backends.container.base"] = graph["hpcrun.backends.container.base"] | {"hpcrun.model.site"}
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert _cycle(graph), "the model -> backends -> model circle would not have been found"


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    """A room of more than 15 modules is a flat room: cut it by concern (docs/architecture.md)."""
    crowded = [f"{d.relative_to(PKG.parent)}: {n} modules" for d in sorted(PKG.rglob("*")) if d.is_dir()
               and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > FOLDER_MODULES_MAX]
    assert not crowded, "\n".join(crowded)


def test_operate_top_level_holds_sub_rooms_and_a_few_shared_modules() -> None:
    top = sorted(p.stem for p in (PKG / "operate").glob("*.py") if p.name != "__init__.py")
    assert top == ["manifest", "metrics", "plandir", "results"], top


def test_the_package_root_stays_small() -> None:
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= ROOT_MODULES_MAX, f"{len(root)} modules at the package root: {root}"


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_no_module_above_the_size_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MODULE_LINES_MAX, f"{path.relative_to(PKG.parent)} has {lines} lines (limit {MODULE_LINES_MAX})"


FUNCTION_LINES_MAX = 80


def _functions(path: Path) -> List[Tuple[int, str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.lineno, n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno is not None]


def test_no_function_above_the_size_limit() -> None:
    """Small functions (complexity is bounded by ruff's C901 at 20, see pyproject.toml)."""
    long = [f"{path.relative_to(PKG.parent)}:{line} {name}() has {size} lines"
            for path in sorted(PKG.rglob("*.py")) for line, name, size in _functions(path)
            if size > FUNCTION_LINES_MAX]
    assert not long, f"functions above {FUNCTION_LINES_MAX} lines:\n" + "\n".join(long)
