"""Load YAML while remembering the file and line of every key and item.

Errors must name file, line and key, so the loader keeps a map from each value's
path (``('jobs', 'nodes')``) to where it was written. Duplicate keys are errors:
PyYAML would silently keep the last one, which hides typos.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import yaml

from .errors import InputError, Problem

KeyPath = Tuple[Any, ...]


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


def load_yaml(path: Path, text: Optional[str] = None) -> Located:
    """Parse one YAML document; syntax errors become an :class:`InputError`."""
    name = str(path)
    try:
        if text is None:
            text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError([Problem(name, None, "", f"cannot read the file: {exc.strerror}")]) from None
    except UnicodeDecodeError:
        raise InputError([Problem(name, None, "", "the file is not UTF-8 text")]) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InputError([Problem(name, None, "", "the file is empty; it must hold a YAML mapping")])
        builder = _Builder(name, loader)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        raise InputError([Problem(name, line, "", f"YAML syntax error: {exc.problem}")]) from None
    except yaml.YAMLError as exc:
        raise InputError([Problem(name, None, "", f"YAML error: {exc}")]) from None
    finally:
        loader.dispose()
    if builder.problems:
        raise InputError(builder.problems)
    if not isinstance(data, dict):
        raise InputError([Problem(name, 1, "", "the top level must be a mapping of keys to values")])
    return Located(data, name, builder.positions)
