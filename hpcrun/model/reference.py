"""Key references generated from the models (the docs site's campaign-spec and site-profile keys),
so the documentation of what is accepted cannot drift from what is accepted."""

from __future__ import annotations

import typing
from typing import Any, Iterator, List, Set, Tuple, Type

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

Row = Tuple[str, str, str, str]   # key path, type, default, description


def model_paths(model: Type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key path of ``model``: ``a.b`` for nested mappings, ``a[].b`` for list items,
    ``a.<name>.b`` for mappings with free keys; aliases (``podman-hpc``) where they exist."""
    for path, _t, _d, _desc in rows(model, prefix):
        yield path


def rows(model: Type[BaseModel], prefix: str = "") -> Iterator[Row]:
    """One row per key, parents before their children."""
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        # pydantic keeps a field's own Annotated[...] metadata apart from its annotation
        full = typing.Annotated[tuple([info.annotation, *info.metadata])] if info.metadata else info.annotation
        yield path, type_text(full), _default(info), (info.description or "").replace("\n", " ")
        yield from _inner(info.annotation, path)


def _inner(annotation: Any, path: str) -> Iterator[Row]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from rows(annotation, path + ".")
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        for arg in args:
            yield from _inner(arg, path + "[]")
    elif origin is dict:
        yield from _inner(args[1], path + ".<name>")
    else:  # Optional / Union / Annotated / Literal: look inside
        for arg in args:
            yield from _inner(arg, path)


def type_text(annotation: Any) -> str:
    """A short reader's name for an annotation: ``list of mapping``, ``one of a, b``, ``number``."""
    from hpcrun.model import fields
    named = {fields.Duration: "duration", fields.Size: "size", fields.Count: "count", fields.Command: "command",
             fields.AbsPath: "absolute path", fields.InputPath: "path or URL", fields.Name: "name",
             fields.Hdf5Path: "HDF5 dataset path"}
    for kind, text in named.items():
        if annotation == kind:
            return text
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is typing.Union:
        parts = [type_text(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(parts))
    if origin in (list, tuple, set, frozenset):
        return "list of " + (type_text(args[0]) if args else "values")
    if origin is dict:
        return "mapping of name to " + type_text(args[1])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "text", int: "whole number", float: "number", bool: "true or false"}.get(annotation, str(annotation))


def _default(info: Any) -> str:
    if info.is_required():
        return "required"
    if info.default is not PydanticUndefined:
        value = info.default
        return "" if value is None else f"`{value}`" if not isinstance(value, (list, dict)) or value else ""
    return ""


def slug(heading: str) -> str:
    """The anchor Markdown's toc gives a heading (``#### `inputs.files` `` -> ``inputsfiles``)."""
    return "".join(c for c in heading.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def markdown(title: str, intro: str, model: Type[BaseModel], detail_page: str, anchors: Set[str]) -> str:
    """A reference page: every key in a table, linking to its section of ``detail_page`` where it has one."""
    out: List[str] = [f"# {title}", "", intro, "", "| key | type | default | description |", "|---|---|---|---|"]
    for path, kind, default, desc in rows(model):
        anchor = slug(path)
        key = f"[`{path}`]({detail_page}#{anchor})" if anchor in anchors else f"`{path}`"
        out.append(f"| {key} | {_cell(kind)} | {_cell(default)} | {_cell(desc)} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
