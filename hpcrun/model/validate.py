"""Turn pydantic validation errors into plain sentences with file, line and key.

Inspired by the idea (not the code) of rewriting schema errors for humans: an
unknown key gets a did-you-mean and the list of valid keys; a wrong type names the
expected type and the value found.
"""

from __future__ import annotations

import typing
from typing import Any, List, Optional, Sequence, Type, TypeVar

from pydantic import BaseModel, ValidationError

from hpcrun.errors import InputError, Problem, did_you_mean, dotted
from hpcrun.model.yamlsrc import Located

M = TypeVar("M", bound=BaseModel)

_TYPE_WORDS = {
    "int_type": "a whole number", "int_parsing": "a whole number", "float_type": "a number",
    "string_type": "text", "bool_type": "true or false", "list_type": "a list",
    "dict_type": "a mapping of keys to values", "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}


def _model_at(model: Type[BaseModel], loc: Sequence[Any]) -> Optional[Type[BaseModel]]:
    """The model class reached by walking ``loc`` from ``model`` (None if not a model)."""
    current: Any = model
    for part in loc:
        owner = _inner_model(current)
        if owner is None:
            return None
        if isinstance(part, int):
            current = owner
            continue
        field = _field_by_key(owner, str(part))
        if field is None:
            return None
        current = field.annotation
    return _inner_model(current)


def _field_by_key(model: Type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _inner_model(annotation: Any) -> Any:
    """Find a BaseModel inside Optional[...], List[...], Dict[...] annotations."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _strip_union_tags(model: Type[BaseModel], loc: Sequence[Any]) -> List[Any]:
    """Drop the member names pydantic puts into the location of an error inside a union
    (``files.0.InputFile.checksum`` -> ``files.0.checksum``)."""
    out: List[Any] = []
    current: Any = model
    for part in loc:
        members = [a for a in typing.get_args(current) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(part, str) and any(m.__name__ == part for m in members):
            current = next(m for m in members if m.__name__ == part)
            continue
        out.append(part)
        owner = _inner_model(current)
        if owner is None:
            current = None
        elif isinstance(part, int):
            current = _list_item(current)
        else:
            field = _field_by_key(owner, str(part))
            current = field.annotation if field is not None else None
    return out


def _list_item(annotation: Any) -> Any:
    """The item type of a List[...] (looking through Optional), else the annotation itself."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) in (list, tuple):
            return typing.get_args(arg)[0]
    return annotation


def _keys(model: Type[BaseModel]) -> List[str]:
    return [f.alias or n for n, f in model.model_fields.items()]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problems_from(exc: ValidationError, model: Type[BaseModel], src: Located,
                  prefix: Sequence[Any] = ()) -> List[Problem]:
    problems: List[Problem] = []
    errors = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
        errors.append((_strip_union_tags(model, loc), err))
    # In a union (a path, or a mapping with a path), the branch whose type fits reports the
    # real problem further down; drop the other branch's "expected text" at the same place.
    deeper = {tuple(loc[:n]) for loc, _ in errors for n in range(len(loc))}
    for loc, err in errors:
        if err["type"] in _TYPE_WORDS and tuple(loc) in deeper:
            continue
        path = tuple(prefix) + tuple(loc)
        file, line = src.where(path)
        kind = err["type"]
        key = dotted(path)
        if kind == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            valid = _keys(owner) if owner else []
            hint = did_you_mean(str(loc[-1]), valid)
            msg = f"unknown key '{loc[-1]}'.{hint}"
            if valid:
                msg += f" Valid keys here: {', '.join(valid)}."
        elif kind == "missing":
            file, line = src.where(path[:-1])
            msg = f"required key '{loc[-1]}' is missing."
        elif kind in ("literal_error", "enum"):
            expected = err.get("ctx", {}).get("expected", "")
            msg = f"{_short(err.get('input'))} is not allowed here; use one of {expected}."
        elif kind in _TYPE_WORDS:
            msg = f"expected {_TYPE_WORDS[kind]}, found {_short(err.get('input'))}."
        elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
            msg = f"{_short(err.get('input'))} is out of range: {err['msg'].lower()}."
        elif kind == "value_error":
            msg = str(err.get("ctx", {}).get("error", err["msg"]))
            if not msg.endswith("."):
                msg += "."
        else:
            msg = err["msg"] + "."
        problems.append(Problem(file, line, key, msg))
    return problems


def build(model: Type[M], src: Located, data: Any = None) -> M:
    """Validate ``src`` (or ``data`` located by ``src``) into ``model``; raise InputError."""
    try:
        return model.model_validate(src.data if data is None else data)
    except ValidationError as exc:
        raise InputError(problems_from(exc, model, src)) from None
