"""Every untrusted string field, found from ``hpcrun schema``, carries hostile values safely.

Nobody lists fields here: the campaign and profile JSON Schemas are walked for every string
leaf (a field added later is covered the day it is added); profile fields marked
``x-hpcrun-trusted`` (programs and their options, written by site staff) are skipped. For
each shipped example on each shipped profile, every such field present is given a hostile
value at once -- ``$(...)``, backticks, ``;``, both quotes, blanks, non-ASCII; then TAB and a
line break; then a leading ``-`` -- each field with markers of its own. The plan must either
refuse a field with exit-2 problems naming its key, or render scripts that pass ``bash -n``
and that, run for real under stand-in programs (srun, the container runtimes, the database
server, the campaign's programs), create no marker file and hand every value to its program
as one intact argument.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest
import yaml

from hpcrun.errors import InputError
from hpcrun.model.profiles import available, load_profile
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .conftest import REPO
from .test_render import EXAMPLES, _variant

pytestmark = pytest.mark.slow
Path_ = Tuple[Any, ...]
FAKE_SRUN = REPO / "tests" / "fakes" / "srun"


def string_fields(schema: Dict[str, Any]) -> Set[Path_]:
    """Schema paths of every free-text leaf (``0`` = any list item, ``*`` = any mapping value)."""
    defs = schema.get("$defs", {})
    out: Set[Path_] = set()

    def walk(node: Dict[str, Any], path: Path_) -> None:
        if node.get("x-hpcrun-trusted"):
            return
        if "$ref" in node:
            walk(defs[node["$ref"].split("/")[-1]], path)
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key, []):
                walk(sub, path)
        kind = node.get("type")
        if kind == "object":
            for name, sub in node.get("properties", {}).items():
                walk(sub, path + (name,))
            if isinstance(node.get("additionalProperties"), dict):
                walk(node["additionalProperties"], path + ("*",))
        elif kind == "array":
            walk(node.get("items", {}), path + (0,))
        elif kind == "string" and "enum" not in node and "const" not in node:
            out.add(path)
    walk(schema, ())
    return out


def schema_for(kind: str) -> Dict[str, Any]:
    """What `hpcrun schema campaign|profile` prints."""
    out = subprocess.run([sys.executable, "-m", "hpcrun.cli", "schema", kind], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


SPEC_FIELDS = string_fields(schema_for("campaign"))
PROFILE_FIELDS = string_fields(schema_for("profile"))
# program names: a hostile one is a program that does not exist (quoted, never run as code);
# they are checked by the static pass only, so the run can go on past them
PROGRAMS = {("chain", "command", 0), ("merge", "command", 0), ("qa", "command", 0),
            ("qa", "count_events", 0), ("finalize", "command", 0), ("database", "server")}


def occurrences(data: Any, fields: Set[Path_]) -> List[Tuple[Any, ...]]:
    """Concrete paths in ``data`` (a YAML mapping) of the schema fields that hold text there."""
    found: List[Tuple[Any, ...]] = []

    def walk(value: Any, concrete: Tuple[Any, ...], abstract: Path_) -> None:
        if isinstance(value, str) and abstract in fields:
            found.append(concrete)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, concrete + (k,), abstract + (k,))
                walk(v, concrete + (k,), abstract + ("*",))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, concrete + (i,), abstract + (0,))
    walk(data, (), ())
    return sorted(set(found), key=str)


def _get(data: Any, path: Tuple[Any, ...]) -> Any:
    for p in path:
        data = data[p]
    return data


def _set(data: Any, path: Tuple[Any, ...], value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _dotted(path: Tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def hostile(marks: Path, tag: str, variant: str, original: str) -> str:
    """A hostile value for one field; its markers name the field (``tag``)."""
    m = f"{marks}/{tag}"
    payload = f" $(touch {m}-a)`touch {m}-b`;touch {m}-c 'q\"d é✓"
    if variant == "lines":
        payload = f"\t$(touch {m}-d)\n;touch {m}-e\n"
    if variant == "dash":
        return f"-{tag} $(touch {m}-f)"
    return original + payload


STUB = r'''#!/usr/bin/env python3
import json, os, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps({"prog": name, "argv": args}) + "\n")
def run(cmd):
    os.execvp(cmd[0], cmd) if cmd else sys.exit(0)
if name == "srun":
    os.execv(sys.executable, [sys.executable, os.environ["FAKE_SRUN"], *args])
if name == "ch-run":
    run(args[args.index("--") + 1:] if "--" in args else [])
if name in ("apptainer", "podman-hpc"):
    rest = args[1:]
    if name == "podman-hpc" and rest[:1] == ["--rm"]:
        rest = rest[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("-B", "--bind", "-e", "--env", "-v", "--volume") else rest[1:]
    run(rest[1:])
if name == "sarus":
    rest = args[1:]
    for mount in [a for a in rest if a.startswith("--mount=")]:
        fields = dict((f.split("=", 1) + [""])[:2] for f in mount[len("--mount="):].split(","))
        if not os.path.exists(fields["source"]):
            sys.exit("sarus: bind source missing: " + fields["source"])
    while rest and rest[0].startswith("-"):
        rest = rest[1:]
    run(rest[1:])
if name == "shifter":
    while args and args[0].startswith("-"):
        args = args[1:]
    run(args)
if name == "stub-dbserver":
    os.execvp("sleep", ["sleep", "60"])
if name == "stub-count":
    print(100)
sys.exit(0)
'''
STUB_NAMES = ["srun", "ch-run", "apptainer", "podman-hpc", "sarus", "shifter", "module", "stub-dbserver",
              "mariadb-admin", "mariadb", "mysqladmin", "mysql", "stub-chain", "stub-merge", "stub-qa", "stub-count",
              "stub-finalize"]


def _stubs(root: Path) -> Path:
    bin_dir = root / "stubs"
    bin_dir.mkdir()
    script = bin_dir / "stub.py"
    script.write_text(STUB)
    script.chmod(0o755)
    for name in STUB_NAMES:
        (bin_dir / name).symlink_to(script)
    return bin_dir


def _normalize(data: Dict[str, Any], root: Path) -> None:
    """Make the example runnable here: local inputs, payload and outputs, stand-in programs."""
    data_dir = root / "data"
    data_dir.mkdir(exist_ok=True)
    for i in range(2):
        (data_dir / f"run{i}.raw").write_bytes(b"r" * (100 + i))
    algo = data.get("inputs", {}).get("checksum", "adler32")
    data["inputs"] = {"glob": str(data_dir / "*.raw"), "events": 100, "checksum": algo}
    for section, name in (("chain", "stub-chain"), ("merge", "stub-merge"), ("finalize", "stub-finalize")):
        if data.get(section):
            data[section]["command"] = [name] + [a for a in _argv(data[section]["command"])[1:]]
    if data.get("qa"):
        for key, name in (("command", "stub-qa"), ("count_events", "stub-count")):
            if data["qa"].get(key):
                data["qa"][key] = [name] + _argv(data["qa"][key])[1:]
    if data.get("database"):
        payload = root / "payload"
        payload.mkdir(exist_ok=True)
        (payload / "t.frm").write_bytes(b"x")
        data["database"].update(payload=str(payload), server="stub-dbserver", size="1MB", ready_timeout="20s")
    data["walltime"] = "00:30:00"
    data.setdefault("jobs", {})["chains_per_node"] = 2
    if data.get("burst_buffer"):
        data["burst_buffer"]["stage_inputs"] = False   # site stage_from prefixes are not here
    if data.get("finalize"):
        data["finalize"].pop("walltime", None)
    data["outputs"]["location"] = str(root / "out")
    data["outputs"].pop("workdir", None)
    if data.get("container", {}).get("runtime") in ("apptainer", "charliecloud"):
        image = root / "image"
        image.mkdir(exist_ok=True)
        data["container"]["image"] = str(image)


def _argv(cmd: Any) -> List[str]:
    import shlex
    return shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]


def _profile_data(name: str, root: Path) -> Dict[str, Any]:
    """The profile as data. With the Shifter stand-in the per-node cache is a host path, so it goes under
    ``root``: the profile's own (/tmp/hpcrun-pnc, /dbcache) is shared with the cluster tests running meanwhile."""
    data = json.loads(json.dumps(load_profile(name, ("test", None, "site.profile")).source.data))
    data.pop("extends", None)
    data["name"] = "hostile"
    shifter = data.get("containers", {}).get("shifter")
    if isinstance(shifter, dict) and "cache_mount" in shifter:
        shifter["cache_mount"] = str(root / "pnc")
    return data


class Case:
    """The spec and profile of one example on one profile, with hostile fields reverted one by
    one as the plan refuses them."""

    def __init__(self, root: Path, spec: Dict[str, Any], profile: Dict[str, Any]):
        self.root = root
        self.original = {"spec": spec, "profile": profile}
        self.data = json.loads(json.dumps(self.original))
        self.paths: Dict[Tuple[str, str], Tuple[Any, ...]] = {}
        self.tags: Dict[Tuple[str, str], str] = {}

    def mutate(self, which: str, fields: Set[Path_], skip: Set[Path_], marks: Path, variant: str) -> None:
        for path in occurrences(self.original[which], fields):
            if path in skip:
                continue
            tag = f"{which[0].upper()}{len(self.tags)}"
            _set(self.data[which], path, hostile(marks, tag, variant, _get(self.original[which], path)))
            self.paths[(which, _dotted(path))] = path
            self.tags[(which, _dotted(path))] = tag

    def write(self) -> Path:
        (self.root / "site").mkdir(exist_ok=True)
        prof = self.root / "site" / "hostile.yaml"
        prof.write_text(yaml.safe_dump(self.data["profile"], allow_unicode=True))
        self.data["spec"]["site"]["profile"] = str(prof)
        spec = self.root / "campaign.yaml"
        spec.write_text(yaml.safe_dump(self.data["spec"], allow_unicode=True, sort_keys=False))
        return spec

    def refused_by(self, exc: InputError) -> Set[Tuple[str, str]]:
        """The hostile fields the problems name; a problem naming none of them fails the test."""
        hit: Set[Tuple[str, str]] = set()
        for p in exc.problems:
            which = "profile" if p.file.endswith("hostile.yaml") else "spec"
            keys = {(w, k) for (w, k) in self.tags if w == which and (
                p.key == k or k.startswith(p.key + ".") or k.startswith(p.key + "[")
                or p.key.startswith(k + ".") or p.key.startswith(k + "["))}
            assert keys, f"refused a value that was not made hostile: {p.render()}"
            hit |= keys
        return hit

    def revert(self, keys: Set[Tuple[str, str]]) -> None:
        for which, key in keys:
            path = self.paths[(which, key)]
            _set(self.data[which], path, _get(self.original[which], path))

    def plan(self):
        refused: Set[Tuple[str, str]] = set()
        for _ in range(15):
            try:
                return load_plan(self.write()), refused
            except InputError as exc:
                keys = self.refused_by(exc)
                assert keys - refused, f"no progress: {exc}"
                refused |= keys
                self.revert(keys)
        raise AssertionError("did not converge")


def _run(plan_dir: Path, root: Path, stubs: Path) -> List[Dict[str, Any]]:
    log = root / "stub.log"
    log.touch()
    bb = root / "bb"
    (bb / "in").mkdir(parents=True, exist_ok=True)
    for raw in (root / "data").glob("*.raw"):
        shutil.copy(raw, bb / "in" / raw.name)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STUB_LOG": str(log), "FAKE_SRUN": str(FAKE_SRUN),
           "SLURM_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NUM_NODES": "1",
           "DW_JOB_STRIPED": f"{bb}/", "DW_JOB_PRIVATE": f"{bb}/", "DW_JOB_hpcrun": f"{bb}/", "HOME": str(root),
           "TMPDIR": str(root)}
    scripts = sorted((plan_dir / "jobs").glob("*.sbatch"))
    for script in [s for s in scripts if s.name != "finalize.sbatch"][:1] + \
            [s for s in scripts if s.name == "finalize.sbatch"]:
        subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True, timeout=120,
                       start_new_session=True)
    return [json.loads(line) for line in log.read_text().splitlines()]


CASES = [(e, p) for e in EXAMPLES for p in sorted(available())]
SEEN: Dict[str, Set[str]] = {"accepted": set(), "refused": set()}


@pytest.mark.parametrize("variant", ["printable", "lines", "dash"])
@pytest.mark.parametrize("example, profile", CASES, ids=[f"{e.parent.name}-{p}" for e, p in CASES])
def test_hostile_values_in_every_field(example, profile, variant, tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    marks = root / "marks"
    marks.mkdir()
    original = yaml.safe_load(_variant(example, profile, root).read_text())
    _normalize(original, root)
    spec = root / "baseline.yaml"
    spec.write_text(yaml.safe_dump(original, sort_keys=False))
    try:
        load_plan(spec)
    except InputError as exc:
        pytest.skip(f"{example.parent.name} does not fit {profile}: {exc.problems[0].message[:80]}")
    case = Case(root, original, _profile_data(profile, root))
    case.mutate("spec", SPEC_FIELDS, PROGRAMS | {("site", "profile")}, marks, variant)
    case.mutate("profile", PROFILE_FIELDS, {("name",)}, marks, variant)
    plan, refused = case.plan()
    plan_dir = write_plan(plan, root / "plan").out_dir
    for script in sorted(plan_dir.glob("*/*.sh")) + sorted(plan_dir.glob("jobs/*.sbatch")):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    calls = _run(plan_dir, root, _stubs(root))
    assert sorted(p.name for p in marks.iterdir()) == [], "a hostile value ran as a command"
    accepted = {f"{w}:{k}": t for (w, k), t in case.tags.items() if (w, k) not in refused}
    for call in calls:
        for arg in call["argv"]:
            for key, tag in accepted.items():
                if f"/{tag}-" in arg and variant != "dash":
                    value = hostile(marks, tag, variant, "")
                    assert value in arg, f"{key} reached {call['prog']} split or changed: {arg!r}"
    SEEN["accepted"] |= {k.split(":")[-1] for k in accepted}
    SEEN["refused"] |= {k for _, k in refused}


def test_program_names_are_quoted_words(spec_factory, tmp_path):
    """A hostile program name is a program that does not exist, never code."""
    marks = tmp_path / "marks"
    marks.mkdir()
    bad = f"reco$(touch {marks}/x)`touch {marks}/y`"
    spec = spec_factory({"chain": {"command": [bad, "{input}"]}, "merge": {"command": [bad, "{output}"]}},
                        inputs=1)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    env = dict(os.environ, PATH=f"{FAKE_SRUN.parent}:{os.environ['PATH']}", SLURM_JOB_ID="5",
               SLURM_JOB_NUM_NODES="1", SLURM_ARRAY_TASK_ID="0")
    script = next((plan_dir / "jobs").glob("*.sbatch"))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 7 and list(marks.iterdir()) == []


def test_schema_walk_finds_fields_added_later():
    assert ("database", "payload") in SPEC_FIELDS and ("database", "server") in SPEC_FIELDS
    assert ("software", "env", "*") in SPEC_FIELDS and ("inputs", "files", 0, "path") in SPEC_FIELDS
    assert ("node_local", "path") in PROFILE_FIELDS
    assert ("launcher", "command") not in PROFILE_FIELDS     # trusted: site staff's program
    assert len(SPEC_FIELDS) >= 40 and len(PROFILE_FIELDS) >= 20


def test_every_field_was_exercised():
    """Runs after the matrix (file order): each schema field was made hostile somewhere."""
    if not SEEN["accepted"]:
        pytest.skip("the matrix did not run in this session (-k or a single test)")
    done = SEEN["accepted"] | SEEN["refused"]
    assert len(SEEN["accepted"]) >= 25, sorted(SEEN["accepted"])
    for must in ("database.payload", "outputs.location", "software.release", "description",
                 "chain.command[1]"):
        assert any(k.startswith(must) for k in SEEN["accepted"]), (must, sorted(done))
    stat.S_ISREG(0)
    sys.stdout.write(f"hostile fields accepted: {len(SEEN['accepted'])}, refused: {len(SEEN['refused'])}\n")
