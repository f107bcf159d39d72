"""Each output that passed QA in a completed job gets a provenance record, against fake sbatch/squeue/sacct
(the job's run records written here as the job writes them; tests/test_job_local.py runs the job itself,
tests/cluster/test_generations.py the whole on the real Slurm): `hpcrun outputs` lists the records as
text, JSON and CSV, per generation; a sidecar beside each output when the spec asks; a failed job's
outputs are not recorded; a plan without a store is refused."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from click.testing import CliRunner

from hpcrun import api
from hpcrun.cli import main
from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.supervision.supervise import run
from hpcrun.operate.tracking import track
from hpcrun.operate.tracking.inflight import InFlight

from .test_supervise import Cluster, _names_from_store, _plan


class Jobs(Cluster):
    """Ends the fake jobs, each after writing the run records a real one writes (QA rows, output sums)."""

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
            (run_dir / "outputs.tsv").write_text(f"{stem}.reco\t{1000 + int(stem[-3:])}\tsha256:{stem * 2}\n")
            (run_dir / "image.id").write_text("sha256:feed\n")   # what the runtime said of its image
        super().after_round(rnd)


def _drive(plan_dir: Path, fake, fates=None):
    jobs = Jobs(fake, plan_dir, fates or {})
    report = run(plan_dir, interval=1, on_round=jobs.after_round, sleep=lambda s: None, max_rounds=10)
    assert report.outcome == "finished"


def test_outputs_lists_what_made_each_output(tmp_path, spec_factory, fake_slurm, store_backend):
    plan_dir = _plan(tmp_path, spec_factory, software={"release": "SL23d"},
                     container={"runtime": "apptainer", "image": "docker://star/reco@sha256:" + "ab" * 32})
    _drive(plan_dir, fake_slurm, {"test-campaign.00002": [("FAILED", "7:0")]})
    records = list(api.outputs(plan_dir))
    assert sorted(Path(r["output"]).name for r in records) == ["run000.reco", "run001.reco", "run002.reco"]
    one = next(r for r in records if r["output"].endswith("run001.reco"))
    assert one["output"] == str(tmp_path / "out" / "run001.reco") and one["size"] == 1001
    assert one["checksum"] == "sha256:run001run001" and one["release"] == "SL23d"
    assert one["image_digest"] == "sha256:" + "ab" * 32 and one["runtime"] == "apptainer"
    assert one["inputs"][0]["path"].endswith("run001.raw") and one["inputs"][0]["checksum"].startswith("adler32:")
    assert one["generation"] == 1 and one["exit_code"] == 0 and one["job_id"] and one["spec_digest"]
    assert len(records) == 3   # the failed first run of 00002 left no record: only its completed retry

    text = CliRunner().invoke(main, ["outputs", str(plan_dir), "--json"])
    assert text.exit_code == 0, text.output
    assert [r["output"] for r in json.loads(text.output)] == [r["output"] for r in records]
    table = CliRunner().invoke(main, ["outputs", str(plan_dir), "--csv", "--generation", "1"])
    rows = list(csv.DictReader(io.StringIO(table.output)))
    assert len(rows) == 3 and rows[0]["checksum"].startswith("sha256:") and json.loads(rows[0]["inputs"])
    plain = CliRunner().invoke(main, ["outputs", str(plan_dir)])
    assert len(plain.output.splitlines()) == 3 and "\tsha256:" in plain.output
    missing = CliRunner().invoke(main, ["outputs", str(plan_dir), "--generation", "4"])
    assert missing.exit_code == 2 and "has no generation 4" in missing.output


def test_sidecars_beside_the_outputs(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory, outputs={"provenance": "sidecar"})
    (tmp_path / "out").mkdir()
    _drive(plan_dir, fake_slurm)
    side = json.loads((tmp_path / "out" / "run002.reco.prov.json").read_text())
    assert side["output"] == str(tmp_path / "out" / "run002.reco") and side["checksum"] == "sha256:run002run002"
    assert "sidecar" not in side and side["image_digest"] == "sha256:feed"   # the runtime's word, none pinned


def test_two_pollers_that_see_one_end_record_its_outcomes_once(tmp_path, spec_factory, fake_slurm, store_backend,
                                                               monkeypatch):
    """`hpcrun status` beside `hpcrun run`: both read the jobs in flight, both see them end; the second finds the
    transition recorded, and must not record the QA outcomes and provenance a second time."""
    plan_dir = _plan(tmp_path, spec_factory)
    assert len(api.submit(plan_dir).rows()) == 3
    Jobs(fake_slurm, plan_dir, {}).after_round(None)
    with open_plan_store(plan_dir) as store:
        campaign_id = store.get_campaign("test-campaign").id
        seen_in_flight = InFlight().read(store, campaign_id)
    assert len(seen_in_flight) == 3
    first = track.poll(plan_dir)
    stale: list = []   # the list as it was read before the first poll recorded the ends
    monkeypatch.setattr(InFlight, "read", lambda self, store, cid: stale.append(1) or seen_in_flight)
    second = track.poll(plan_dir)
    assert stale, "the second poll did not read the jobs in flight through InFlight"
    assert first.observed == 3 and second.observed == 0
    assert len(list(api.outputs(plan_dir))) == 3
    with open_plan_store(plan_dir) as store:
        assert len(store.report_rows(campaign_id).qa) == 3


def test_outputs_of_a_plan_never_submitted_is_refused(tmp_path, spec_factory):
    plan_dir = _plan(tmp_path, spec_factory)
    refused = CliRunner().invoke(main, ["outputs", str(plan_dir), "--json"])
    assert refused.exit_code == 2 and "has no campaign store" in refused.output, refused.output
    assert not (plan_dir / "state.db").exists()
