"""The package's layers and import graph: data flows one way, and no module reaches back up.

load (model) -> validate -> plan -> render -> operate -> store -> report, with the backends
at the bottom (the models derive their lists of kinds from the backends' registries) and the
command line on top. Every ``import`` in the package, module-level or inside a function, is
read from the source, except those under ``if TYPE_CHECKING:`` (annotations only, never run);
an import of a higher layer, an import between sibling rooms that must stay independent, or
a cycle fails this test with the offending lines.
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
    ("hpcrun.report", "hpcrun.iotune"),
]
ROOT_MODULES_MAX = 8
MODULE_LINES_MAX = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> List[Tuple[str, int]]:
    """Every hpcrun module ``path`` imports, with its line."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in _runtime_nodes(tree):
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


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree: ast.AST) -> List[ast.AST]:
    """Every node outside ``if TYPE_CHECKING:`` bodies (their ``else`` runs and is kept)."""
    out: List[ast.AST] = []
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        if _is_type_checking(node):
            stack.extend(node.orelse)  # type: ignore[attr-defined]
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
    mods = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, path in mods.items():
        graph[name] = {t for t, _ in imports_of(path) if t in mods and t != name}
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


def test_type_checking_imports_are_left_out() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hpcrun.cli\n"
                     "else:\n    import hpcrun.units\nimport hpcrun.errors\n")
    names = {n.names[0].name for n in _runtime_nodes(tree) if isinstance(n, ast.Import)}
    assert names == {"hpcrun.units", "hpcrun.errors"}


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


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
