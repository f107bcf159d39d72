"""``outputs.export``: the supervisor sends each output on once its input is done, verified by the
destination's own size and adler32 (a real XRootD origin on loopback, tests/xrootd.py), against fake
sbatch/squeue/sacct (tests/fake_slurm.py; the real cluster: tests/cluster/test_xrootd_export.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from hpcrun.operate.plandir import open_plan_store
from hpcrun.operate.supervision.supervise import run
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan

from .test_supervise import Cluster, _names_from_store
from .xrootd import USER, why_not

needs_xrootd = pytest.mark.skipif(bool(why_not()), reason=why_not() or "ok")




@pytest.fixture
def quick_profile(tmp_path, monkeypatch):
    """local-test with exports retried after 0.2 s (doubling) instead of 30 s."""
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "quick.yaml").write_text(yaml.safe_dump({
        "name": "quick", "extends": "local-test", "exports": {"streams": 2, "backoff": "0.2s", "max_backoff": "1s"},
        "xrootd": {"connection_retry": 2, "connection_window": "1s", "request_timeout": "10s"}}))
    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(d))
    return "quick"


def _plan(tmp_path, spec_factory, export, profile, **over):
    spec = spec_factory({"site": {"profile": profile}, "jobs": {"array": "never"},
                         "outputs": {"export": export}, **over}, inputs=3)
    return write_plan(load_plan(spec), tmp_path / "plan").out_dir


def _drive(plan_dir, fake_slurm, fates, outputs, max_rounds=60):
    """Run the supervisor; each job writes its output just before it ends."""
    cluster = Cluster(fake_slurm, fates)
    rounds = []

    def between(rnd):
        rounds.append(rnd)
        _names_from_store(plan_dir, cluster)
        for row in fake_slurm.queue():
            name = cluster.names.get(row.split("|")[1])
            if name in outputs:
                outputs[name].parent.mkdir(parents=True, exist_ok=True)
                outputs[name].write_bytes(os.urandom(200_000 + hash(name) % 1000))
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: time.sleep(0.05), max_rounds=max_rounds)
    return report, rounds


def _outputs(tmp_path):
    out = tmp_path / "out"
    return {f"test-campaign.{n + 1:05d}": out / f"run{n:03d}.reco" for n in range(3)}


@needs_xrootd
def test_outputs_are_sent_to_the_origin_and_verified_there(tmp_path, spec_factory, fake_slurm, xrootd_origin,
                                                          quick_profile, store_backend):
    plan_dir = _plan(tmp_path, spec_factory, f"{xrootd_origin.origin.url}//store/reco", quick_profile)
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    assert manifest["export"]["to"] == f"{xrootd_origin.origin.url}//store/reco" and manifest["export"]["streams"] == 2
    outputs = _outputs(tmp_path)
    # job 3 fails its QA: its input is parked, its output is never sent
    report, rounds = _drive(plan_dir, fake_slurm, {"test-campaign.00003": [("FAILED", "9:0")]}, outputs)
    assert report.outcome == "finished", [r.summary() for r in rounds]
    sent = xrootd_origin.data / "store" / "reco"
    assert sorted(p.name for p in sent.iterdir()) == ["run000.reco", "run001.reco"]   # no partial file left
    for name in ("run000.reco", "run001.reco"):
        assert (sent / name).read_bytes() == (tmp_path / "out" / name).read_bytes()
    last = report.rounds[-1]
    assert last.exports["files"] == {"pending": 0, "verified": 2, "failed": 0} and "2 verified" in last.summary()
    with open_plan_store(plan_dir) as store:
        c = store.get_campaign("test-campaign")
        rows = store.exports(c.id)
        assert [r.state for r in rows] == ["verified", "verified"]
        assert all(r.checksum.startswith("adler32:") and r.bytes == (tmp_path / "out" / Path(r.source).name)
                   .stat().st_size for r in rows)
    from hpcrun.report.gather import campaign_report
    rep, _ = campaign_report(plan_dir)
    assert rep.exports["files"]["verified"] == 2 and rep.exports["bytes"] == sum(r.bytes for r in rows)
    assert rep.exports["mb_per_s"] > 0 and rep.exports["backlog"] == 0
    metrics = (plan_dir / "metrics.prom").read_text()
    assert 'hpcrun_export_files{campaign="test-campaign",state="verified"} 2' in metrics
    assert f'hpcrun_export_bytes_total{{campaign="test-campaign"}} {rep.exports["bytes"]}' in metrics
    _live_page_shows_the_exports(plan_dir, rep.exports["bytes"])


def _live_page_shows_the_exports(plan_dir, size):
    """`hpcrun serve`: the exports' rows on the live page, in headless Chromium."""
    import threading

    from hpcrun.report.web import make_server

    from . import browser
    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser: {reason}")
    srv = make_server(plan_dir, port=0, min_age=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def check(page):
        text = page.text_content("#merit")
        assert "outputs exported: verified, waiting, given up2, 0, 0" in text, text
        assert f"exported GB, MB/s, failed attempts{size / 1e9:.3g}," in text, text

    try:
        browser.open_page(f"http://127.0.0.1:{srv.server_address[1]}/", "dashboard-exports.png", check)
    finally:
        srv.shutdown()
        srv.server_close()


@needs_xrootd
def test_a_destination_that_refuses_writes_keeps_the_outputs_and_says_why(tmp_path, spec_factory, fake_slurm,
                                                                          xrootd_origin, quick_profile, cli):
    ro = xrootd_origin.data / "store" / "locked"
    ro.mkdir(parents=True)
    os.chown(xrootd_origin.data / "store", *_ids(USER))
    ro.chmod(0o755)                      # owned by root: the server (the test user) cannot write there
    plan_dir = _plan(tmp_path, spec_factory, f"{xrootd_origin.origin.url}//store/locked/reco", quick_profile,
                     retry={"on": {"export": {"max_attempts": 2}}})
    outputs = _outputs(tmp_path)
    report, rounds = _drive(plan_dir, fake_slurm, {}, outputs)
    assert report.outcome == "finished", [r.summary() for r in rounds]
    assert report.rounds[-1].exports["files"] == {"pending": 0, "verified": 0, "failed": 3}
    with open_plan_store(plan_dir) as store:
        rows = store.exports(store.get_campaign("test-campaign").id)
    print(rows[0].last_error)
    assert all("xrdcp to" in r.last_error and "ermission denied" in r.last_error and r.attempts == 2
               for r in rows), rows    # the server's own words
    assert all(p.exists() for p in outputs.values())        # the outputs stay on the cluster
    assert not any(ro.iterdir())
    status = cli("status", str(plan_dir))
    assert "3 given up" in status.output and "kept in" in status.output and "ermission denied" in status.output, \
        status.output
    from hpcrun.report.gather import campaign_report
    rep, _ = campaign_report(plan_dir)
    assert rep.attempts_by_class.get("export") == 6 and rep.exports["failed_attempts"] == 6


def _ids(user):
    import pwd
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def test_outputs_exported_to_a_directory_on_another_filesystem(tmp_path, spec_factory, fake_slurm, quick_profile):
    dest = tmp_path / "archive" / "reco"
    plan_dir = _plan(tmp_path, spec_factory, str(dest), quick_profile)
    outputs = _outputs(tmp_path)
    report, rounds = _drive(plan_dir, fake_slurm, {}, outputs)
    assert report.outcome == "finished", [r.summary() for r in rounds]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == {p.name: p.read_bytes() for p in outputs.values()}


def test_an_export_server_that_cannot_be_reached_is_refused_at_plan_time(tmp_path, spec_factory, cli,
                                                                         quick_profile):
    from .xrootd import free_port
    url = f"root://127.0.0.1:{free_port()}//store/reco"
    spec = spec_factory({"site": {"profile": quick_profile}, "outputs": {"export": url}})
    started = time.monotonic()
    res = cli("plan", str(spec), "--out", str(tmp_path / "plan"))
    assert res.exit_code == 2 and url in res.output and "outputs.export" in res.output, res.output
    assert time.monotonic() - started < 30 and not (tmp_path / "plan").exists()


@pytest.mark.parametrize("export, words", [
    ("relative/dir", "neither root://HOST[:PORT]//PATH nor an absolute directory"),
    ("https://example.org/store", "root://HOST[:PORT]//PATH or to a directory"),
    ("root://host//a b", "hpcrun can write to"),
])
def test_an_export_destination_hpcrun_cannot_use_is_refused(tmp_path, spec_factory, cli, export, words):
    spec = spec_factory({"outputs": {"export": export}})
    res = cli("plan", str(spec), "--out", str(tmp_path / "plan"))
    assert res.exit_code == 2 and words in res.output and "outputs.export" in res.output, res.output


def test_without_a_supervisor_done_inputs_wait_as_exporting(tmp_path, spec_factory, fake_slurm, quick_profile, cli):
    """`submit` and `status` alone copy nothing: done inputs show as exporting, not done."""
    plan_dir = _plan(tmp_path, spec_factory, str(tmp_path / "archive"), quick_profile)
    assert cli("submit", str(plan_dir)).exit_code == 0
    for row in fake_slurm.queue():
        fake_slurm.end(row.split("|")[1], "COMPLETED", "0:0")
    st = json.loads(cli("status", str(plan_dir), "--json").output)
    assert st["inputs"]["done"] == 0 and st["inputs"]["exporting"] == 3, st["inputs"]
    assert st["exports"]["files"] == {"pending": 0, "verified": 0, "failed": 0}
    assert not (tmp_path / "archive").exists()


@needs_xrootd
def test_exports_follow_each_generation(tmp_path, spec_factory, fake_slurm, quick_profile):
    """A generation planned while the first one's jobs run: their outputs go where the first one said,
    the new generation's from its own outputs location to its own destination (the supervisor not
    restarted)."""
    from click.testing import CliRunner

    from hpcrun.cli import main

    plan_dir = _plan(tmp_path, spec_factory, str(tmp_path / "archive" / "v1"), quick_profile)
    spec, outputs, cluster = tmp_path / "campaign.yaml", _outputs(tmp_path), Cluster(fake_slurm, {})

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        if rnd.number == 1:   # the three jobs of generation 1 are in flight
            data = yaml.safe_load(spec.read_text())
            data["outputs"].update(location=str(tmp_path / "out2"), export=str(tmp_path / "archive" / "v2"))
            spec.write_text(yaml.safe_dump(data))
            (tmp_path / "data" / "run003.raw").write_bytes(b"z" * 1500)
            res = CliRunner().invoke(main, ["plan", str(spec), "--out", str(plan_dir), "--apply"])
            assert res.exit_code == 0 and "1 added" in res.output, res.output
            outputs["test-campaign.00004"] = tmp_path / "out2" / "run003.reco"
        for row in fake_slurm.queue():
            name = cluster.names.get(row.split("|")[1])
            if name in outputs:
                outputs[name].parent.mkdir(parents=True, exist_ok=True)
                outputs[name].write_bytes(os.urandom(100_000))
        cluster.after_round(rnd)

    report = run(plan_dir, interval=1, on_round=between, sleep=lambda s: time.sleep(0.05), max_rounds=60)
    assert report.outcome == "finished", [r.summary() for r in report.rounds]
    archive = tmp_path / "archive"
    got = {p.relative_to(archive).as_posix(): p.read_bytes() for p in archive.rglob("*.reco")}
    assert got == {"v1/run000.reco": outputs["test-campaign.00001"].read_bytes(),
                   "v1/run001.reco": outputs["test-campaign.00002"].read_bytes(),
                   "v1/run002.reco": outputs["test-campaign.00003"].read_bytes(),
                   "v2/run003.reco": outputs["test-campaign.00004"].read_bytes()}
