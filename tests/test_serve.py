"""``hpcrun serve``: the read-only live page, its JSON and its refusals, over real HTTP on loopback
and in headless Chromium (the cluster's real campaign: tests/cluster/test_supervisor.py)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from hpcrun.errors import InputError
from hpcrun.operate.supervision.supervise import run
from hpcrun.plan import footprint as F
from hpcrun.plan.load import load_plan
from hpcrun.render.plandir import write_plan
from hpcrun.report.web import make_server

from . import browser
from .test_supervise import Cluster, _names_from_store

NASTY = '<img src=x onerror="alert(1)">'

# every test here runs on the plan's SQLite store and on PostgreSQL (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("store_backend")


@pytest.fixture
def campaign(tmp_path, spec_factory, fake_slurm):
    """A campaign driven to the end by `hpcrun run` on the fake Slurm: 2 done (one after a retry), 1 parked."""
    plan_dir = write_plan(load_plan(spec_factory({"jobs": {"array": "never"}}, inputs=3)), tmp_path / "plan").out_dir
    cluster = Cluster(fake_slurm, {"test-campaign.00001": [("FAILED", "7:0")],
                                   "test-campaign.00003": [("FAILED", "9:0", NASTY)]})   # markup in a reason

    def between(rnd):
        _names_from_store(plan_dir, cluster)
        cluster.after_round(rnd)

    assert run(plan_dir, interval=1, on_round=between, sleep=lambda s: None, max_rounds=10).outcome == "finished"
    return plan_dir


@pytest.fixture
def server(campaign):
    srv = make_server(campaign, port=0, min_age=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", campaign
    finally:
        srv.shutdown()
        srv.server_close()


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers, r.read().decode()


def test_page_json_metrics_and_nothing_else(server):
    base, plan_dir = server
    status, headers, page = _get(base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"] and headers["Cache-Control"] == "no-store"
    assert "Campaign <span id=\"campaign\">test-campaign</span>" in page
    assert NASTY not in page and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page   # escaped, never markup
    data = json.loads(_get(base + "/api/summary.json?x=%27%20OR%201%3D1%20--")[2])   # the query is ignored
    assert data["inputs"]["done"] == 2 and data["inputs"]["parked"] == 1 and data["inputs_total"] == 3
    assert data["heartbeat"]["phase"] == "finished" and data["attempts_by_class"] == {"chain": 1, "qa": 1}
    assert data["chart"]["completed"].count(",") == 3          # origin + 2 completions
    assert "hpcrun_plan_jobs" in _get(base + "/metrics")[2]
    for path in ("/../state.db", "/state.db", "/api/summary.json/..", "/%2e%2e/manifest.json"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            _get(base + path)
        assert exc.value.code == 404
    req = urllib.request.Request(base + "/", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 501     # read-only: no method but GET


def test_serve_refuses_a_plan_without_state(tmp_path, spec_factory):
    plan_dir = write_plan(load_plan(spec_factory({})), tmp_path / "plan").out_dir
    with pytest.raises(InputError, match="no campaign state yet|has no campaign .test-campaign.: start it"):
        make_server(plan_dir, port=0)


def test_dashboard_in_headless_chromium(server):
    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser: {reason}")
    base, _plan = server

    def check(page):
        assert page.text_content("#done") == "2" and page.text_content("#parked") == "1"
        assert page.text_content("#total") == "3"
        assert "finished" in page.text_content("#beat")
        assert page.get_attribute("#line-completed", "points").count(",") == 3
        assert page.text_content("#jobs td[data-state='parked']") == "1"
        assert "chain" in page.text_content("#classes")
        assert page.evaluate("document.querySelectorAll('img').length") == 0   # the nasty reason stayed text
        assert page.text_content("#forecast").startswith("forecast: ended")   # finished: its own end, no line
        assert page.get_attribute("#line-forecast", "points") == ""

    shot = browser.open_page(base + "/", "dashboard-fake-slurm.png", check)
    assert shot.stat().st_size > 10_000


def test_footprint_made_so_far_on_the_page(server):
    """Each forecast filesystem's files and bytes made so far (estimated from the store's counts, no walk) against
    the plan's forecast: in the JSON, and in the table the page's script fills in."""
    base, plan_dir = server
    data = json.loads(_get(base + "/api/summary.json")[2])
    outputs, plan = data["footprint"]                          # the outputs location, the plan directory
    assert (outputs["path"], plan["path"]) == (str(plan_dir.parent / "out"), str(plan_dir))
    assert outputs["now"]["files"] == 2 + F.OUTPUT_DIRS        # two inputs done, one parked
    parts = {p["part"]: p["now"]["files"] for p in plan["parts"]}
    assert parts["run records"] == 2 * F.RUN_DIR_ENTRIES + F.FOLDED_FILES   # the two failed runs keep theirs
    assert outputs["cells"]["now"] == "~3 files, 2 KB" and outputs["cells"]["end"] == "4 files, 3 KB"
    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser: {reason}")
    shown = [[f["cells"][k] for k in ("where", "now", "end", "peak", "quota")] for f in data["footprint"]]

    def check(page):
        assert page.is_visible("#footprint-part") and "est." in page.text_content("#footprint")
        rows = page.eval_on_selector_all("#footprint tr", "rs => rs.map(r => Array.from(r.cells, c => c.textContent))")
        assert rows[1:] == shown

    browser.open_page(base + "/", "footprint-fake-slurm.png", check)


def test_no_footprint_for_a_plan_made_before_it(server):
    """A manifest without the forecast (an older plan): no figures, the part hidden, the page whole."""
    from .test_footprint_now import _forget_the_forecast

    base, plan_dir = server
    _forget_the_forecast(plan_dir)
    assert json.loads(_get(base + "/api/summary.json")[2])["footprint"] == []
    assert '<div id="footprint-part" hidden>' in _get(base + "/")[2]
    reason = browser.why_not()
    if reason:
        pytest.skip(f"no headless browser: {reason}")

    def check(page):
        assert not page.is_visible("#footprint-part") and page.text_content("#done") == "2"

    browser.open_page(base + "/", "footprint-none-fake-slurm.png", check)
