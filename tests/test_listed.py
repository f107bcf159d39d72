"""A large list file is scanned, not held: the plan it gives is byte for byte the plan of the whole-file
reading, its jobs are made block by block when read, and what the quick checks cannot vouch for goes
to the whole-file reading (or is reported at its line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import yaml

from hpcrun.errors import HpcrunError, InputError
from hpcrun.plan.job import listed as L
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

DATA = "/hpcrun-test-nonexistent/data"


def _spec(tmp_path: Path, lines: List[str], **over: object) -> Path:
    (tmp_path / "files.txt").write_text("".join(lines), encoding="utf-8")
    spec: Dict[str, object] = {
        "name": "lst", "site": {"profile": "local-test"}, "walltime": "00:30:00",
        "inputs": {"list_file": "files.txt"}, "jobs": {"files_per_job": 1, "chains_per_node": 2},
        "chain": {"command": ["reco", "--in", "{input}", "--out", "{output}", "--events", "{first_event}:{nevents}"]},
        "merge": {"command": ["merge", "{output}", "{parts}"]},
        "outputs": {"location": "/hpcrun-test-nonexistent/out", "pattern": "{stem}.reco"},
    }
    for key, value in over.items():
        section, _, name = key.partition("__")
        spec[section] = dict(spec[section], **{name: value}) if name else value   # type: ignore[arg-type]
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def _lines(n: int, events: bool = True, every_comment: int = 0, dirs: int = 3) -> List[str]:
    out = ["# PATH SIZE EVENTS\n"]
    for i in range(n):
        if every_comment and i % every_comment == 0:
            out.append("\n# a comment between inputs\n")
        tail = f" {1000 + i % 13}\n" if events else "\n"
        out.append(f"{DATA}/d{i % dirs}/st_physics_{i:07d}.daq {1 + i % 7}GB{tail}")
    return out


def _tree(top: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def _both(spec: Path, tmp_path: Path, monkeypatch, block: int = 4096):
    """The plan directory written by the whole-file reading and by the scan (same path, moved aside)."""
    trees = {}
    kinds = {}
    for name, limit in (("whole", 1 << 40), ("streamed", 0)):
        monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", limit)
        monkeypatch.setattr(L, "BLOCK_BYTES", block)
        plan = load_plan(spec)
        kinds[name] = type(plan.jobs).__name__
        write_plan(plan, tmp_path / "plan")
        os.rename(tmp_path / "plan", tmp_path / name)
        trees[name] = _tree(tmp_path / name)
    return kinds, trees


@pytest.mark.parametrize("case", ["events", "no-events", "adler32", "name-pattern", "regex", "comments-crlf",
                                  "apptainer"])
def test_streamed_plan_is_byte_identical_to_the_whole_reading(tmp_path, monkeypatch, case):
    lines = _lines(700, events=case != "no-events", every_comment=97 if case == "comments-crlf" else 0)
    if case == "comments-crlf":
        lines = [line.replace("\n", "\r\n") for line in lines]
    over: Dict[str, object] = {"inputs__checksum": "adler32" if case == "adler32" else "none"}
    if case == "no-events":
        over["inputs__events"] = 500
    if case == "name-pattern":
        over["outputs__pattern"] = "{name}.{stem}.reco"
    if case == "regex":
        over["inputs__stem"] = r"physics_(?P<stem>\d+)"
    if case == "apptainer":   # the inputs' directories bound into the container, from the scan's parents
        over.update(site={"profile": "generic-apptainer", "partition": "compute"},
                    container={"runtime": "apptainer", "image": "/hpcrun-test-nonexistent/img.sif"})
    kinds, trees = _both(_spec(tmp_path, lines, **over), tmp_path, monkeypatch)
    assert kinds == {"whole": "tuple", "streamed": "ListedJobs"}
    assert trees["whole"] == trees["streamed"]
    assert trees["whole"]["tasks.tsv"].count(b"\n") == 700
    if case == "apptainer":
        script = trees["streamed"]["jobs/array001.sbatch"].decode()
        assert all(f"{DATA}/d{k}" in script for k in range(3)), "each input directory bound"
    if case == "adler32":   # the note the whole reading gives, with its first paths
        manifest = trees["streamed"]["manifest.json"].decode()
        assert "700 input(s) have no checksum" in manifest and "st_physics_0000000.daq" in manifest


def test_streamed_jobs_read_as_a_sequence(tmp_path, monkeypatch):
    spec = _spec(tmp_path, _lines(500))
    monkeypatch.setattr(L, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", 1 << 40)
    held = load_plan(spec).jobs
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", 0)
    plan = load_plan(spec)
    jobs = plan.jobs
    assert isinstance(jobs, L.ListedJobs) and len(jobs.listed.spans) > 10
    assert list(jobs) == list(held) and len(jobs) == 500
    for i in (0, 1, 37, 38, 250, 499, -1, -500):
        assert jobs[i] == held[i]
    view = jobs[123:401]
    assert list(view) == list(held[123:401]) and (view.first_index, view.last_index) == (123, 400)
    assert list(view[5:9]) == list(held[128:132]) and list(jobs[600:700]) == []
    with pytest.raises(IndexError):
        jobs[500]
    assert plan.input_bytes == sum(i.size for j in held for i in j.inputs)
    assert [s.array for s in plan.scripts] == ["0-499"] and list(plan.scripts[0].jobs) == list(held)


@pytest.mark.parametrize("change, key", [
    ("dup-path", "listed twice"), ("dup-stem", "same stem"), ("no-size", None), ("url", None), ("path-stem", None)])
def test_what_the_scan_cannot_vouch_for_goes_to_the_whole_reading(tmp_path, monkeypatch, change, key):
    lines = _lines(300)
    over: Dict[str, object] = {}
    if change == "dup-path":
        lines[250] = lines[20]
    elif change == "dup-stem":
        lines[250] = lines[20].replace("/d", "/other/d")
    elif change == "no-size":
        lines[200] = lines[200].split()[0] + "\n"
        over.update(inputs__size="2GB", inputs__events=100)
    elif change == "url":
        lines = [line.replace(DATA, "root://xrd.example.org//store") for line in lines]
    elif change == "path-stem":
        over["inputs__stem"] = "path"
    spec = _spec(tmp_path, lines, **over)
    monkeypatch.setattr(L, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", 0)
    if key is not None:
        with pytest.raises(InputError) as exc:
            load_plan(spec)
        assert key in str(exc.value) and "files.txt" in str(exc.value)
        return
    try:
        plan = load_plan(spec)
    except InputError as exc:   # URLs are asked of their server, which is not there: still not the scan
        assert change == "url" and "xrd.example.org" in str(exc)
        return
    assert isinstance(plan.jobs, tuple) and len(plan.jobs) == 300


def test_a_hash_collision_goes_to_the_whole_reading(tmp_path, monkeypatch):
    spec = _spec(tmp_path, _lines(300))
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", 0)
    monkeypatch.setattr(L._Hashes, "distinct", lambda self: False)
    assert isinstance(load_plan(spec).jobs, tuple)


def _problems(spec: Path, monkeypatch, limit: int) -> List[tuple]:
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", limit)
    with pytest.raises(InputError) as exc:
        load_plan(spec)
    return [(Path(p.file).name, p.line, p.message) for p in exc.value.problems]


def test_bad_lines_are_named_at_their_lines_as_the_whole_reading_names_them(tmp_path, monkeypatch):
    lines = _lines(900, every_comment=50)
    lines[120] = lines[120].replace("GB", "GQ")
    lines[700] = lines[700].rstrip("\n") + "x\n"
    lines[705] = "relative/path.daq 1GB 3\n"
    spec = _spec(tmp_path, lines)
    monkeypatch.setattr(L, "BLOCK_BYTES", 2048)
    streamed = _problems(spec, monkeypatch, 0)
    assert streamed == _problems(spec, monkeypatch, 1 << 40)
    text = "".join(lines).splitlines()
    at = [text.index(lines[k].rstrip("\n")) + 1 for k in (120, 700, 705)]
    assert [(f, n) for f, n, _ in streamed] == [("files.txt", n) for n in at] and at[0] > 120


@pytest.mark.parametrize("bad, message", [(b"\xff", "not UTF-8"), (b"\x00", "NUL byte")])
def test_a_binary_byte_far_down_is_named_at_its_line(tmp_path, monkeypatch, bad, message):
    lines = _lines(800)
    spec = _spec(tmp_path, lines)
    data = (tmp_path / "files.txt").read_bytes().replace(b"st_physics_0000777", b"st_physics_" + bad + b"000777")
    (tmp_path / "files.txt").write_bytes(data)
    monkeypatch.setattr(L, "BLOCK_BYTES", 2048)
    streamed = _problems(spec, monkeypatch, 0)
    assert streamed == _problems(spec, monkeypatch, 1 << 40)
    assert len(streamed) == 1 and streamed[0][1] == 779 and message in streamed[0][2]


def test_a_list_changed_after_the_scan_is_refused_and_no_plan_is_left(tmp_path, monkeypatch):
    spec = _spec(tmp_path, _lines(300))
    monkeypatch.setattr(L, "STREAM_ABOVE_BYTES", 0)
    monkeypatch.setattr(L, "BLOCK_BYTES", 2048)
    plan = load_plan(spec)
    with open(tmp_path / "files.txt", "a", encoding="utf-8") as f:
        f.write(f"{DATA}/late.daq 1GB 10\n")
    with pytest.raises(HpcrunError) as exc:
        write_plan(plan, tmp_path / "plan")
    assert "changed while the plan was being made" in str(exc.value)
    assert not (tmp_path / "plan").exists() and not list(tmp_path.glob(".plan.hpcrun-*"))


def _rss_child(spec: Path, out: Path, stream_above: Optional[int]) -> int:
    """Peak RSS (KiB) of a child that plans and writes ``spec``: VmHWM, which starts afresh at exec
    (ru_maxrss would carry the forking test process's own peak over)."""
    code = ("from pathlib import Path; import hpcrun.plan.job.listed as L\n"
            f"if {stream_above!r} is not None: L.STREAM_ABOVE_BYTES = {stream_above!r}\n"
            "from hpcrun.plan.load import load_plan; from hpcrun.render.plandir import write_plan\n"
            f"write_plan(load_plan(Path({str(spec)!r})), Path({str(out)!r}))\n"
            "print([ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM:')][0])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HPCRUN_PROFILE_PATH=str(Path(__file__).parents[1] / "site-profiles")))
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


def test_the_scan_holds_no_input(tmp_path):
    """200k inputs: the scanned plan's peak is below the held plan's by most of what holding costs
    (each input held is ~600 bytes; the scan keeps 8), a figure that does not depend on the machine."""
    n = 200_000
    spec = _spec(tmp_path, _lines(n))
    held = _rss_child(spec, tmp_path / "held", 1 << 40)
    scanned = _rss_child(spec, tmp_path / "scanned", None)
    assert (held - scanned) * 1024 > n * 300, (held, scanned)


def test_a_campaign_on_two_clusters_streams_each_cluster_alike(tmp_path, monkeypatch):
    """Each cluster's plan scans the list itself; the plan directory is the whole reading's."""
    example = Path(__file__).resolve().parents[1] / "examples" / "two-clusters-local"
    for f in example.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    spec = yaml.safe_load((example / "campaign.yaml").read_text())
    spec["inputs"] = {"list_file": "files.txt"}
    for key in ("burst_buffer", "qa"):   # a buffer sizes each job: not streamable
        del spec[key]
    (tmp_path / "files.txt").write_text("".join(f"{DATA}/raw/run{i:05d}.h5 1GB\n" for i in range(1500)))
    (tmp_path / "campaign.yaml").write_text(yaml.safe_dump(spec))
    kinds, trees = _both(tmp_path / "campaign.yaml", tmp_path, monkeypatch)
    assert kinds == {"whole": "tuple", "streamed": "ListedJobs"}
    assert trees["whole"] == trees["streamed"] and any(k.startswith("clusters/") for k in trees["streamed"])
