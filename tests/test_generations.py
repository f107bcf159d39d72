"""A changed spec planned into a submitted plan directory makes the campaign's next generation, against
fake sbatch/squeue/sacct: what it would change is said first and nothing is written without --apply;
the supervisor takes it up at its next round; done inputs stay done, inputs in flight finish under
their own generation, added inputs join, removed ones are withdrawn; --reprocess all reruns done work
into a new output location and refuses an old one. The same on the real Slurm:
tests/cluster/test_generations.py."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import yaml
from click.testing import CliRunner

from hpcrun.cli import main
from hpcrun.operate.manifest import read_json
from hpcrun.operate.plandir import open_plan_store, read_manifest
from hpcrun.operate.supervision.supervise import run

from .test_supervise import Cluster, _names_from_store, _plan


def _spec_edit(spec: Path, **changes) -> None:
    data = yaml.safe_load(spec.read_text())
    for key, value in changes.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    spec.write_text(yaml.safe_dump(data, sort_keys=False))


def _plan_cli(spec: Path, plan_dir: Path, *extra: str):
    return CliRunner().invoke(main, ["plan", str(spec), "--out", str(plan_dir), *extra])


def _states(plan_dir: Path) -> dict:
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        return {Path(r.path).name: r.state for r in store.inputs(c.id)}


def _generations_of_runs(plan_dir: Path) -> dict:
    """Plan job name -> generation of each of its submissions, as the store recorded them."""
    from sqlalchemy import select

    from hpcrun.store.sql import schema
    with open_plan_store(plan_dir) as store:
        s, link, t = schema.submission, schema.submission_input, schema.input_file
        query = (select(t.c.path, s.c.generation, s.c.script_path).join(link, link.c.submission_id == s.c.id)
                 .join(t, t.c.id == link.c.input_id).order_by(s.c.id))
        with store.engine.connect() as conn:
            out: dict = {}
            for path, gen, script in conn.execute(query):
                out.setdefault(Path(path).name, []).append((gen or 1, script))
            return out


def test_a_submitted_plan_gets_a_new_generation_only_when_told(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    spec = tmp_path / "campaign.yaml"
    cluster = Cluster(fake_slurm, {"test-campaign.00002": [("FAILED", "9:0")]})
    # round 1 submits the 3 jobs; they end between rounds: 00002's QA fails (parked at once), the others done
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    _names_from_store(plan_dir, cluster)
    cluster.after_round(None)
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)   # records the ends
    before = (plan_dir / "manifest.json").read_bytes()
    _spec_edit(spec, walltime="00:40:00", **{"software.release": "SL24b"})
    for i in (3, 4):
        (tmp_path / "data" / f"run{i:03d}.raw").write_bytes(b"y" * 2000)
    (tmp_path / "data" / "run002.raw").unlink()   # removed from the list after it was done: stays done

    shown = _plan_cli(spec, plan_dir, "--diff")
    assert shown.exit_code == 0, shown.output
    assert "generation 2 (reprocess: none)" in shown.output and "nothing written" in shown.output
    assert "2 added" in shown.output and "2 stay done" in shown.output and "0 withdrawn" in shown.output
    assert "--time=00:40:00" in shown.output or "00:40:00" in shown.output   # the scripts' diff
    assert (plan_dir / "manifest.json").read_bytes() == before and not (plan_dir / "generations").exists()

    applied = _plan_cli(spec, plan_dir, "--apply")
    assert applied.exit_code == 0, applied.output
    manifest = read_json(plan_dir)
    assert manifest["generation"]["number"] == 2 and (plan_dir / "generations" / "2" / "manifest.json").is_file()
    assert os.path.islink(plan_dir / "generations" / "2" / "run")

    rounds = []

    def between(rnd):
        rounds.append(rnd)
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=12)
    assert report.outcome == "finished", [r.summary() for r in rounds]
    states = _states(plan_dir)
    assert states == {"run000.raw": "done", "run001.raw": "parked", "run002.raw": "done", "run003.raw": "done",
                      "run004.raw": "done"}
    runs = _generations_of_runs(plan_dir)
    assert [g for g, _ in runs["run000.raw"]] == [1]                    # done: not run again
    assert all(g == 2 and s.startswith("generations/2/") for g, s in runs["run003.raw"] + runs["run004.raw"])
    assert [g for g, _ in runs["run001.raw"]] == [1]                    # parked: left alone (reprocess none)
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        gens = store.generations(c.id)
        by_gen = store.counts_by_generation(c.id)
        log = [e.detail for e in store.audit_log(c.id)]
    assert [g.number for g in gens] == [1, 2] and gens[1].details["release"] == "SL24b"
    assert by_gen[1] == {"done": 2, "parked": 1} and by_gen[2] == {"done": 2}
    assert any("planned generation 2" in d for d in log) and any("took up generation 2" in d for d in log)
    # the figures of each generation: status, the live page's rows (and the report's), the metrics file
    status = CliRunner().invoke(main, ["status", str(plan_dir), "--json"])
    figures = json.loads(status.output)["generations"]
    assert [(g["number"], g["inputs"], g["release"]) for g in figures] == [
        (1, {"done": 2, "parked": 1}, None), (2, {"done": 2}, "SL24b")]
    assert "generation 2 (release SL24b" in CliRunner().invoke(main, ["status", str(plan_dir)]).output
    from hpcrun.report.web import summary
    rows = dict(summary(plan_dir)["merit"])
    assert rows["generation 2"] == "2 done" and rows["generation 1"] == "2 done, 1 parked"
    assert 'test-campaign",generation="2",state="done"} 2' in (plan_dir / "metrics.prom").read_text()
    _page_shows_generations(plan_dir)
    scripts = {s for g, s in runs["run003.raw"] + runs["run004.raw"]}
    for script in scripts:   # what Slurm was handed: the new generation's walltime and release
        text = (plan_dir / script).read_text()
        body = text.rsplit("exec bash ", 1)[1].strip()   # the steps the header runs: its own generation's
        assert "--time=00:40:00" in text and "HPCRUN_RELEASE=SL24b" in Path(body).read_text(), script
        assert body.startswith(str(plan_dir / "generations" / "2")), body
    assert "--time=00:30:00" in (plan_dir / runs["run000.raw"][0][1]).read_text()   # the first one's kept


def _page_shows_generations(plan_dir: Path) -> None:
    """The live page (headless Chromium) has a row per generation."""
    import threading

    from hpcrun.report.web import make_server

    from . import browser
    if browser.why_not():
        return
    srv = make_server(plan_dir, port=0, min_age=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        def check(page):
            rows = page.text_content("#merit")
            assert "generation 1" in rows and "generation 2" in rows and "2 done, 1 parked" in rows

        browser.open_page(f"http://127.0.0.1:{srv.server_address[1]}/", "dashboard-generations.png", check)
    finally:
        srv.shutdown()
        srv.server_close()


def test_reprocess_all_needs_a_new_output_location(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    spec = tmp_path / "campaign.yaml"
    cluster = Cluster(fake_slurm, {})
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    _names_from_store(plan_dir, cluster)
    cluster.after_round(None)
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "run000.reco").write_text("generation 1's output")   # what the first job wrote
    refused = _plan_cli(spec, plan_dir, "--apply", "--reprocess", "all")
    assert refused.exit_code == 2, refused.output
    assert "outputs.location" in refused.output and "never overwritten" in refused.output
    assert read_json(plan_dir).get("generation", {}).get("number", 1) == 1
    assert not (plan_dir / "generations" / "2").exists()

    _spec_edit(spec, **{"outputs.location": str(tmp_path / "out-v2")})
    applied = _plan_cli(spec, plan_dir, "--apply", "--reprocess", "all", "--json")
    assert applied.exit_code == 0, applied.output
    change = json.loads(applied.output)["generation"]
    assert change["rerun"] == 3 and change["stay_done"] == 0 and change["applied"]

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=10)
    assert report.outcome == "finished"
    runs = _generations_of_runs(plan_dir)
    assert all([g for g, _ in v] == [1, 2] for v in runs.values()), runs
    assert (out / "run000.reco").read_text() == "generation 1's output"


def test_a_plan_directory_holds_one_campaign(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    spec = tmp_path / "campaign.yaml"
    _spec_edit(spec, name="another-campaign")
    refused = _plan_cli(spec, plan_dir, "--apply")
    assert refused.exit_code == 2 and "holds one campaign" in refused.output, refused.output


def test_an_input_under_another_spelling_would_be_in_two_jobs(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)   # the three jobs in flight
    spec = tmp_path / "campaign.yaml"
    data = tmp_path / "data"
    _spec_edit(spec, inputs={"files": [f"{data}/./run000.raw", f"{data}/run001.raw"], "events": 100})
    refused = _plan_cli(spec, plan_dir, "--apply")
    assert refused.exit_code == 2, refused.output
    assert "under another spelling" in refused.output and "run000.raw" in refused.output
    assert not (plan_dir / "generations").exists()


def test_inputs_listed_no_more_are_withdrawn_not_deleted(tmp_path, spec_factory, fake_slurm):
    plan_dir = _plan(tmp_path, spec_factory)
    with open_plan_store(plan_dir) as store:   # registered, nothing submitted: all pending
        from hpcrun.operate.submission.submit import register
        register(store, read_manifest(plan_dir))
    spec = tmp_path / "campaign.yaml"
    (tmp_path / "data" / "run002.raw").unlink()
    shown = _plan_cli(spec, plan_dir, "--apply")
    assert shown.exit_code == 0 and "1 withdrawn" in shown.output, shown.output
    report = run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    assert report.rounds[-1].submitted == 2
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        rows = {Path(r.path).name: r for r in store.inputs(c.id)}
        assert rows["run002.raw"].job_index is None and rows["run002.raw"].state == "pending"
        assert store.counts_by_state(c.id)["pending"] == 0 and store.counts_by_generation(c.id)[1] == {"withdrawn": 1}
        assert sorted(store.pending_jobs(c.id)) == []


def test_an_apply_stopped_before_the_switch_is_made_again(tmp_path, spec_factory, fake_slurm, monkeypatch):
    from hpcrun.operate.campaign import replan

    plan_dir = _plan(tmp_path, spec_factory)
    run(plan_dir, interval=1, sleep=lambda s: None, max_rounds=1)
    spec = tmp_path / "campaign.yaml"
    _spec_edit(spec, walltime="00:45:00")
    real = replan._swap_manifest

    def killed(*args, **kw):
        raise KeyboardInterrupt   # the operator's Ctrl-C between the new directory and the switch

    monkeypatch.setattr(replan, "_swap_manifest", killed)
    stopped = _plan_cli(spec, plan_dir, "--apply")
    assert stopped.exit_code != 0 and (plan_dir / "generations" / "2" / "manifest.json").is_file()
    assert read_json(plan_dir).get("generation", {}).get("number", 1) == 1   # not switched
    monkeypatch.setattr(replan, "_swap_manifest", real)
    again = _plan_cli(spec, plan_dir, "--apply")
    assert again.exit_code == 0, again.output
    assert read_json(plan_dir)["generation"]["number"] == 2
    assert os.path.islink(plan_dir / "generations" / "2" / "logs")


def test_a_campaign_from_before_generations_is_generation_1(tmp_path, spec_factory, store_backend):
    """A store migrated from schema 9 (no generations): its campaign carries on as generation 1."""
    from sqlalchemy import create_engine, insert

    from hpcrun.store.sql import schema
    from hpcrun.store.store import open_store

    plan_dir = _plan(tmp_path, spec_factory)
    if store_backend is None:
        engine = create_engine(f"sqlite:///{plan_dir / 'state.db'}")
    else:
        engine = create_engine(store_backend)
    manifest = read_manifest(plan_dir)
    with engine.begin() as conn:
        assert schema.migrate(conn, schema.MIGRATIONS[:9]) == 9
        conn.execute(insert(schema.campaign).values(name="test-campaign", spec_digest=manifest.spec_digest,
                                                    profile_digest=manifest.profile_digest,
                                                    created_at=dt.datetime.now(dt.timezone.utc)))
    engine.dispose()
    with open_store(store_backend or plan_dir) as store:
        from hpcrun.operate.submission.submit import register
        c = register(store, manifest)
        assert store.schema_version() == len(schema.MIGRATIONS) == 11
        assert [g.number for g in store.generations(c.id)] == [1]
        assert store.counts_by_state(c.id)["pending"] == 3


def test_the_manifests_name_is_the_same_where_it_is_written_and_where_it_is_read():
    """operate/ reads the manifest by a name of its own (render/, the writer, sits below it but imports the site
    model and jinja2, which `hpcrun run` does without): the two must not drift apart."""
    from hpcrun.operate import manifest
    from hpcrun.render import plandir

    assert manifest.MANIFEST == plandir.MANIFEST
