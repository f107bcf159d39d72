"""Reusable field types for the YAML models: sizes, durations, commands, names.

Each type parses strictly (see :mod:`hpcrun.units`) and exports an honest JSON
Schema, so ``hpcrun schema`` documents what the validator really accepts.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Dict, List, Union

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema
from typing_extensions import Annotated

from hpcrun.units import COUNT_PATTERN, SIZE_PATTERN, parse_count, parse_duration, parse_size


def _size(value: Any) -> int:
    return parse_size(value)


def _duration(value: Any) -> int:
    return parse_duration(value)


Size = Annotated[
    int,
    BeforeValidator(_size),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                              {"type": "string", "pattern": SIZE_PATTERN}],
                    "description": "bytes, or a number with a unit (500GB, 2TiB, 50G)"}),
]

# a count of files (inodes): 10M is ten million, as sites give quotas
Count = Annotated[
    int,
    BeforeValidator(parse_count),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0},
                              {"type": "string", "pattern": COUNT_PATTERN}],
                    "description": "a whole number, or one with K, M or G (powers of 1000: 10M, 500K)"}),
]

Duration = Annotated[
    int,
    BeforeValidator(_duration),
    WithJsonSchema({"type": "string",
                    "description": "Slurm time (HH:MM:SS, D-HH:MM:SS) or 90s/30m/12h/2d; "
                                   "bare numbers are refused as ambiguous"}),
]


def _command(value: Any) -> List[str]:
    if isinstance(value, str):
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split the command into words ({exc}); "
                             "write it as a YAML list of arguments instead") from None
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                         for v in value):
        parts = [str(v) for v in value]
    else:
        raise ValueError("a command is a string or a list of arguments (strings)")
    if not parts:
        raise ValueError("the command is empty")
    if not parts[0].strip():
        raise ValueError("the command's first word (the program) is empty; name the program to run")
    if parts[0].endswith("/"):
        raise ValueError(f"the command's first word ({parts[0]!r}) names a directory, not a program; "
                         "name the program to run")
    if parts[0] in IN_SHELL:
        raise ValueError(f"the command's first word ({parts[0]!r}) is a shell builtin that would run inside the "
                         "job's own shell, not as a program; name a program (for shell code: [bash, -c, ...])")
    if parts[0] in NO_PROGRAM:
        raise ValueError(f"the command's first word ({parts[0]!r}) is a shell builtin with no program of that "
                         "name, and the job runs its commands as programs; name a program (for shell code: "
                         "[bash, -c, ...])")
    return parts


# builtins that would act on the job's shell itself (read a file into it, evaluate text, replace it)
IN_SHELL = frozenset({".", "source", "eval", "exec", "builtin", "command", "alias", "trap", "set", "shopt"})
# builtins that no program stands for: a chain's command is exec'd (templates/hpcrun-chain.sh.j2), so one of these
# would end its input with 127 ("exec: not found") rather than run
NO_PROGRAM = frozenset({":", "cd", "exit", "return", "ulimit", "umask", "wait", "read", "export", "unset", "declare",
                        "local", "readonly", "typeset", "shift", "break", "continue", "let", "mapfile", "readarray",
                        "times", "hash", "jobs", "fg", "bg", "disown", "enable", "pushd", "popd", "dirs", "caller",
                        "logout", "suspend", "type", "help", "history", "fc", "bind", "complete", "compgen",
                        "compopt", "getopts"})


Command = Annotated[
    List[str],
    BeforeValidator(_command),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                    "description": "argv list, or a string split like a shell would (no pipes "
                                   "or redirections; use [bash, -c, ...] for those)"}),
]

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")


def _name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError("a name starts with a letter and holds only letters, digits, '.', '_' "
                         "and '-' (at most 63 characters)")
    return value


Name = Annotated[str, AfterValidator(_name)]


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"'{value}' is not an absolute path; give a path starting with '/'")
    if "\n" in value or "\0" in value:
        raise ValueError("a path cannot contain a newline or NUL byte")
    return value


AbsPath = Annotated[str, AfterValidator(_abs_path)]


def _input_path(value: str) -> str:
    from hpcrun.backends.storage import scheme_of, url_problem
    if scheme_of(value) is None:
        return _abs_path(value)
    why = url_problem(value)
    if why:
        raise ValueError(why)
    return value


# an input: an absolute path, or a URL of a registered storage scheme (root://...)
InputPath = Annotated[str, AfterValidator(_input_path)]


_HDF5_PATH = re.compile(r"^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


def _hdf5_path(value: str) -> str:
    if not _HDF5_PATH.match(value) or ".." in value.split("/"):
        raise ValueError(f"'{value}' is not an HDF5 dataset path hpcrun accepts: names of letters, digits, "
                         "'_', '.' and '-' separated by '/', e.g. /events/energy")
    return "/" + value.lstrip("/")


Hdf5Path = Annotated[str, AfterValidator(_hdf5_path)]


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError("this value must be a single line of text")
    return value


Line = Annotated[str, AfterValidator(_one_line)]

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_names(value: Dict[str, str]) -> Dict[str, str]:
    for key in value:
        if not _ENV_RE.match(key):
            raise ValueError(f"'{key}' is not a valid environment variable name "
                             "(letters, digits and '_', not starting with a digit)")
    return value


EnvVars = Annotated[Dict[str, Line], AfterValidator(_env_names)]

AutoInt = Annotated[
    Union[int, str],
    BeforeValidator(lambda v: v if v == "auto" or (isinstance(v, int) and not isinstance(v, bool))
                    else _raise("a positive whole number or 'auto'")),
]


def _raise(msg: str) -> Any:
    raise ValueError(msg)
