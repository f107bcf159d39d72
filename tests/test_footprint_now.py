"""The files and bytes a campaign has made so far on each forecast filesystem (issue 56, item 3): the plan's own
model on the store's counts, the outputs' recorded sizes and the folded segments' size, never a walk of the
filesystem; `hpcrun status` shows it as text and in --json (the live page: tests/test_serve.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcrun import api
from hpcrun.operate.manifest import read_manifest
from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.submission.submit import register
from hpcrun.operate.supervision.supervise import run
from hpcrun.operate.tracking import footprint as N
from hpcrun.plan import footprint as F
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .test_footprint import LATE
from .test_supervise import Cluster, _names_from_store

OUT_BYTES = 7000   # each output's size as its run records it: unlike the plan's estimate (its input's size)


def _profile(tmp_path: Path, monkeypatch) -> None:
    """A profile whose filesystem 'scratch' holds the outputs (with a quota); the plan directory is under none."""
    prof = tmp_path / "profiles"
    prof.mkdir(exist_ok=True)
    (prof / "fp.yaml").write_text(f"name: fp\nextends: local-test\nfilesystems:\n  scratch:\n"
                                  f"    path: {tmp_path / 'out'}\n    type: lustre\n"
                                  "    quota: {files: 10M, bytes: 20TB}\n")
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(prof))


class Jobs(Cluster):
    """Ends the fake jobs, each after writing the run records a real one writes (QA rows, output sums), so the
    supervisor records their outputs' sizes and folds their run directories."""

    def __init__(self, fake, plan_dir: Path, fates):
        super().__init__(fake, fates)
        self.plan_dir = plan_dir

    def after_round(self, rnd) -> None:
        _names_from_store(self.plan_dir, self)
        with open_plan_store(self.plan_dir) as store:
            c = store.get_campaign("test-campaign")
            paths = {j.job_name: r.path for r in store.inputs(c.id) for j in store.job_states(c.id)
                     if j.job_index == r.job_index}
        for row in self.fake.queue():
            aid = row.split("|")[1]
            name = self.names.get(aid)
            if name is None:
                continue
            stem = Path(paths[name]).stem
            run_dir = self.plan_dir / "run" / name / aid
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "qa.tsv").write_text(f"{stem}\t100\t100\tpass\t{stem}.reco\t{paths[name]}\n")
            (run_dir / "outputs.tsv").write_text(f"{stem}.reco\t{OUT_BYTES}\tsha256:{stem * 2}\n")
            (run_dir / "exit_code").write_text("7\n" if self.fates.get(name) else "0\n")   # what is folded
        super().after_round(rnd)


@pytest.fixture
def driven(tmp_path, spec_factory, fake_slurm, monkeypatch, store_backend):
    """Three one-input jobs run to the end by `hpcrun run` on the fake Slurm; job 2 fails once first (on the
    plan's SQLite store and on PostgreSQL: tests/conftest.py)."""
    _profile(tmp_path, monkeypatch)
    spec = spec_factory({"site": {"profile": "fp"}, "jobs": {"array": "never"}}, inputs=3)
    plan_dir = write_plan(load_plan(spec), tmp_path / "plan").out_dir
    jobs = Jobs(fake_slurm, plan_dir, {"test-campaign.00002": [("FAILED", "7:0")]})
    assert run(plan_dir, interval=1, on_round=jobs.after_round, sleep=lambda s: None,
               max_rounds=10).outcome == "finished"
    return plan_dir


def _made(plan_dir: Path, pilots=None):
    manifest = read_manifest(plan_dir, jobs=False)
    with open_plan_store(plan_dir) as store:
        cid = store.get_campaign(manifest.campaign).id
        seen = N.Seen(store.counts_by_state(cid), store.job_counts(cid), pilots)
        return N.made_so_far(plan_dir, manifest, store, cid, seen), store.runs_by_state(cid)


def _parts(entry) -> dict:
    return {p["part"]: (p["now"]["files"], p["now"]["bytes"]) for p in entry["parts"]}


def test_made_so_far_from_the_store(driven):
    made, runs = _made(driven)
    assert runs == {"COMPLETED": 3, "FAILED": 1}
    outputs, plan = made                               # the forecast's filesystems, in its order
    assert (outputs["name"], outputs["type"], outputs["quota"]) == ("scratch", "lustre",
                                                                    {"files": 10**7, "bytes": 20 * 10**12})
    assert outputs["estimated"] and outputs["end"]["bytes"] != 3 * OUT_BYTES   # the plan's estimate differs
    # the outputs: three, of the sizes the store recorded, and the outputs location's own directory
    assert _parts(outputs) == {"outputs": (3 + F.OUTPUT_DIRS, 3 * OUT_BYTES)}
    assert outputs["now"] == {"files": 3 + F.OUTPUT_DIRS, "bytes": 3 * OUT_BYTES}
    # the plan directory: the failed run keeps its directory and log; the others' were folded, their bytes real
    folded = sum(f.stat().st_size for f in (driven / "run" / "folded").iterdir())
    assert folded > 0 and not (driven / "run" / "test-campaign.00001").exists()
    parts = _parts(plan)
    assert parts["logs"] == (F.ARRAY_LOG_ENTRIES, folded + F.LOG_BYTES_PER_INPUT)
    assert parts["run records"] == (F.RUN_DIR_ENTRIES + F.FOLDED_FILES, 0)
    forecast = read_manifest(driven, jobs=False).footprint["filesystems"][1]   # what the plan wrote, as forecast
    [planned] = [(p["end"]["files"], p["end"]["bytes"]) for p in forecast["parts"] if p["part"] == "plan directory"]
    assert parts["plan directory"] == planned and planned[0] > 0
    assert plan["now"]["files"] == sum(f for f, _ in parts.values())


def test_nothing_is_walked(driven, monkeypatch):
    """Status and the live page ask every minute: one listing of run/folded/, no walk of anything else."""
    listed = []
    real = os.scandir

    def scandir(path="."):
        listed.append(str(path))
        assert str(path).endswith(os.path.join("run", "folded")), f"listed {path}"
        return real(path)

    def refused(*_args, **_kw):
        raise AssertionError("the filesystem was walked")

    monkeypatch.setattr(os, "scandir", scandir)
    for name in ("walk", "listdir"):
        monkeypatch.setattr(os, name, refused)
    for name in ("rglob", "glob", "iterdir"):
        monkeypatch.setattr(Path, name, refused)
    made, _ = _made(driven)
    assert len(made) == 2 and len(listed) == 1


@pytest.mark.parametrize("over", [{"jobs": {"array": "never"}}, {"jobs": {"throttle": 2}},
                                  {"outputs": {"provenance": "sidecar"}}, LATE])
def test_the_same_model_as_the_plan(over, spec_factory, tmp_path, monkeypatch):
    """Given everything done, the figures are the forecast's end; with the most runs in flight, its peak: the
    manifest's view of the plan (shape) is the Plan's, and each part lands on the forecast's filesystem."""
    _profile(tmp_path, monkeypatch)
    plan = load_plan(spec_factory({"site": {"profile": "fp"}, **over}, inputs=5))
    plan_dir = write_plan(plan, tmp_path / "plan").out_dir
    manifest = read_manifest(plan_dir, jobs=False)
    assert N.shape(manifest) == F.shape_of(plan)
    fs = manifest.footprint["filesystems"]
    whole = F.Counts(5, 0, 0, plan.pilot_count, len(plan.jobs), plan.output_bytes)
    assert [f["now"] for f in N.held(fs, F.evaluated(N.shape(manifest), whole))] == [f["end"] for f in fs]
    busy = whole._replace(running=manifest.footprint["running"])
    assert [f["now"] for f in N.held(fs, F.evaluated(N.shape(manifest), busy))] == [f["peak"] for f in fs]


def test_late_binding_counts(spec_factory, tmp_path, monkeypatch):
    """Pilots started (the queue's view: live and ended), tasks done (the queue's done/ files), claims in flight."""
    _profile(tmp_path, monkeypatch)
    plan = load_plan(spec_factory({"site": {"profile": "fp"}, **LATE}, inputs=5))
    plan_dir = write_plan(plan, tmp_path / "plan").out_dir
    manifest = read_manifest(plan_dir)
    with open_plan_store(plan_dir) as store:
        cid = register(store, manifest).id
        seen = N.Seen({"done": 2}, {"done": 2, "running": 1}, {"pilots": [{"pilot": "a"}, {"pilot": "b"}],
                                                                "fenced": 1})
        outputs, plan_fs = N.made_so_far(plan_dir, manifest, store, cid, seen)
    slots = plan.pilots.slots
    assert _parts(outputs)["outputs"][0] == (2 + F.OUTPUT_DIRS + F.LATE_OUTPUT_DIRS + F.CLAIM_OUT_ENTRIES
                                             + F.CLAIM_WORK_ENTRIES)   # the work directory is under it
    parts = _parts(plan_fs)
    assert parts["logs"] == (3 * (F.PILOT_LOG_ENTRIES + slots * F.PER_SLOT_ENTRIES), 2 * F.LOG_BYTES_PER_INPUT)
    assert parts["run records"][0] == (3 * (F.PER_PILOT_ENTRIES - F.PILOT_LOG_ENTRIES) + F.RUN_DIR_ENTRIES
                                       + F.FOLDED_FILES)
    assert parts["queue"] == (3 * F.PER_PILOT_QUEUE_ENTRIES + F.QUEUE_DIRS, 2 * F.QUEUE_BYTES_PER_INPUT)


def _forget_the_forecast(plan_dir: Path) -> None:
    """The manifest as an hpcrun before the forecast wrote it: ``"footprint": null`` (the layout kept)."""
    path = plan_dir / "manifest.json"
    text = path.read_text()
    start = text.index('"footprint": ') + len('"footprint": ')
    _, length = json.JSONDecoder().raw_decode(text[start:])
    path.write_text(text[:start] + "null" + text[start + length:])


def test_status_text_and_json(driven, cli):
    result = cli("status", str(driven))
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.output.splitlines() if x.startswith(f"footprint {driven.parent / 'out'}")]
    assert "(scratch): now ~4 files, 21 KB (est. from the store's counts) of " in line
    assert "forecast at the end (peak " in line and line.endswith("; quota 10 M files, 20 TB")
    assert any(x.startswith(f"footprint {driven}: now ~") for x in result.output.splitlines())
    data = json.loads(cli("status", str(driven), "--json").output)
    assert [f["now"]["bytes"] for f in data["footprint"]][0] == 3 * OUT_BYTES
    assert api.status(driven).footprint[0]["now"] == data["footprint"][0]["now"]   # the Python API's too
    assert data["footprint"][0]["peak"] and data["footprint"][0]["end"] and data["footprint"][0]["estimated"]


def test_a_plan_made_before_the_forecast_shows_nothing(driven, cli):
    _forget_the_forecast(driven)
    assert read_manifest(driven, jobs=False).footprint is None
    assert _made(driven)[0] == []
    result = cli("status", str(driven))
    assert result.exit_code == 0, result.output
    assert "footprint" not in result.output
    assert json.loads(cli("status", str(driven), "--json").output)["footprint"] == []
