"""Find site profiles and resolve ``extends:`` layering.

Override order (documented in docs/site-profiles.md): a profile starts from its
parent's merged values; mappings are merged key by key, everything else (scalars,
lists) is replaced whole by the child. Chains may be any depth; cycles are errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpcrun.errors import InputError, Problem, did_you_mean
from hpcrun.model.site import SiteProfile
from hpcrun.model.validate import build
from hpcrun.model.yamlsrc import KeyPath, Located, load_yaml
from hpcrun.resources import profile_search_path, site_template_dirs


@dataclass(frozen=True)
class ProfileRef:
    name: str
    path: Path


def available() -> Dict[str, ProfileRef]:
    """Every profile name on the search path; earlier directories shadow later ones."""
    found: Dict[str, ProfileRef] = {}
    for directory in profile_search_path():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.yaml")):
            found.setdefault(path.stem, ProfileRef(path.stem, path))
    return found


def locate(name: str, origin: Optional[Tuple[str, Optional[int], str]] = None,
           relative_to: Optional[Path] = None) -> Path:
    """A profile name or a path to a YAML file."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_absolute() and relative_to is not None:
            path = relative_to / path
        if path.is_file():
            return path
        msg = f"profile file '{path}' does not exist"
    else:
        names = available()
        if name in names:
            return names[name].path
        msg = (f"no site profile named '{name}'.{did_you_mean(name, names)} "
               f"Known profiles: {', '.join(sorted(names)) or '(none)'}; "
               "add directories with HPCRUN_PROFILE_PATH.")
    file, line, key = origin or ("<command line>", None, "")
    raise InputError([Problem(file, line, key, msg)])


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    return over


def resolve_raw(path: Path) -> Tuple[Located, List[Path]]:
    """Merged raw data of a profile and its ancestors (child last), with positions."""
    chain: List[Located] = []
    seen: List[Path] = []
    current: Optional[Path] = path
    origin: Optional[Tuple[str, Optional[int], str]] = None
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            cycle = " -> ".join(p.stem for p in seen + [resolved])
            raise InputError([Problem(str(current), None, "extends",
                                      f"profiles extend each other in a cycle: {cycle}")])
        seen.append(resolved)
        src = load_yaml(current)
        chain.append(src)
        parent = src.data.get("extends")
        if parent is None:
            current = None
        elif not isinstance(parent, str):
            _, line = src.where(("extends",))
            raise InputError([Problem(src.file, line, "extends", "extends names one profile (text)")])
        else:
            _, line = src.where(("extends",))
            origin = (src.file, line, "extends")
            current = locate(parent, origin, relative_to=current.parent)
    data: Dict[str, Any] = {}
    positions: Dict[KeyPath, Tuple[str, int]] = {}
    for src in reversed(chain):
        data = _merge(data, src.data)
        positions.update(src.positions)
    data["name"] = chain[0].data.get("name", path.stem)
    return Located(data, chain[0].file, positions), [Path(s.file) for s in chain]


@dataclass(frozen=True)
class LoadedProfile:
    profile: SiteProfile
    source: Located        # merged raw data with the file and line of every key
    files: List[Path]      # the profile file first, then its ancestors


def load_profile(name: str, origin: Optional[Tuple[str, Optional[int], str]] = None,
                 relative_to: Optional[Path] = None) -> LoadedProfile:
    """Resolve and validate a profile and its ``extends`` chain."""
    path = locate(name, origin, relative_to)
    src, files = resolve_raw(path)
    profile = build(SiteProfile, src)
    if profile.template:
        dirs = site_template_dirs(files)
        if not any((d / f"{profile.template}.sh.j2").is_file() for d in dirs):
            file, line = src.where(("template",))
            raise InputError([Problem(file, line, "template", (
                f"template '{profile.template}.sh.j2' was not found in "
                + ", ".join(str(d) for d in dirs) + "; put it in a templates/ directory beside "
                "the profile or in HPCRUN_TEMPLATE_PATH"))])
    return LoadedProfile(profile, src, files)
