"""Load YAML while remembering the file and line of every key and item.

Errors must name file, line and key, so the loader keeps a map from each value's
path (``('jobs', 'nodes')``) to where it was written. Duplicate keys are errors:
PyYAML would silently keep the last one, which hides typos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from hpcrun.errors import InputError, Problem
from hpcrun.model.textfile import YAML_MAX_BYTES, TextFileError, read_text

KeyPath = Tuple[Any, ...]
MAX_VALUES = 2_000_000   # values after alias expansion: 20x a spec listing 10^5 files inline
MAX_DEPTH = 64           # mappings and lists nested in each other


@dataclass
class Located:
    """Plain data plus the positions of its parts (``path -> (file, line)``)."""

    data: Any
    file: str
    positions: Dict[KeyPath, Tuple[str, int]] = field(default_factory=dict)

    def where(self, path: KeyPath) -> Tuple[str, Optional[int]]:
        """Closest known position for ``path`` (falls back to its parents)."""
        p = tuple(path)
        while True:
            if p in self.positions:
                return self.positions[p]
            if not p:
                return (self.file, None)
            p = p[:-1]


class _Builder:
    def __init__(self, file: str, loader: yaml.SafeLoader):
        self.file = file
        self.loader = loader
        self.positions: Dict[KeyPath, Tuple[str, int]] = {}
        self.problems: list[Problem] = []

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.positions[path] = (self.file, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)
            out: Dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.loader.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)) or key is None:
                    self.problems.append(Problem(self.file, key_node.start_mark.line + 1, "",
                                                 "mapping keys must be plain text"))
                    continue
                key = str(key) if not isinstance(key, str) else key
                if key in out:
                    self.problems.append(Problem(
                        self.file, key_node.start_mark.line + 1, ".".join(map(str, path + (key,))),
                        "this key appears twice in the same mapping; keep one of them"))
                    continue
                out[key] = self.build(value_node, path + (key,))
                self.positions[path + (key,)] = (self.file, key_node.start_mark.line + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.loader.construct_object(node, deep=True)


def _check_shape(name: str, root: yaml.Node) -> None:
    """Refuse documents that would expand beyond MAX_VALUES values (an alias "bomb": 1 KB of
    nested aliases can stand for 10^9 values), nest deeper than MAX_DEPTH or refer to
    themselves. Each distinct node is visited once, so this costs as much as the file's size."""
    size: Dict[int, int] = {}
    depth: Dict[int, int] = {}
    on_path: set = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            where = node.start_mark.line + 1
            if size[key] > MAX_VALUES:
                raise InputError([Problem(name, where, "", (
                    f"this value expands to more than {MAX_VALUES:,} values through YAML aliases (*name); "
                    "write the values out or use inputs.list_file for long lists"))])
            if depth[key] > MAX_DEPTH:
                raise InputError([Problem(name, where, "", (
                    f"mappings and lists are nested more than {MAX_DEPTH} levels deep here"))])
            continue
        if key in size:
            continue
        if key in on_path:
            raise InputError([Problem(name, node.start_mark.line + 1, "", (
                "this alias refers to a value that contains it; a spec or profile cannot be recursive"))])
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)


def _children(node: yaml.Node) -> List[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load_yaml(path: Path, text: Optional[str] = None) -> Located:
    """Parse one YAML document; syntax errors become an :class:`InputError`."""
    name = str(path)
    if text is None:
        try:
            text = read_text(Path(path), YAML_MAX_BYTES)
        except TextFileError as exc:
            raise InputError([Problem(name, exc.line, "", f"cannot read the file: {exc.message}")]) from None
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
        raise InputError([Problem(name, line, "", (
            f"the file contains the control character #x{exc.character:04x} (as text), which YAML does "
            "not allow"))]) from None
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise InputError([Problem(name, None, "", (
                f"the YAML is nested too deeply to read; hpcrun accepts at most {MAX_DEPTH} levels"))]) from None
        if node is None:
            raise InputError([Problem(name, None, "", "the file is empty; it must hold a YAML mapping")])
        _check_shape(name, node)
        builder = _Builder(name, loader)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise InputError([Problem(name, line, "", f"YAML syntax error: {exc.problem}")]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
        raise InputError([Problem(name, line, "", "the file contains a character YAML does not allow")]) from None
    except yaml.YAMLError as exc:
        raise InputError([Problem(name, None, "", f"YAML error: {exc}")]) from None
    finally:
        loader.dispose()
    if builder.problems:
        raise InputError(builder.problems)
    if not isinstance(data, dict):
        raise InputError([Problem(name, 1, "", "the top level must be a mapping of keys to values")])
    return Located(data, name, builder.positions)
