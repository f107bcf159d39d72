"""Keep docs/ honest: every key, placeholder, exit code and shipped profile is documented,
documented keys exist, and the worked examples in the docs are valid."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List, Set, Tuple

import pytest

from hpcrun.model.reference import model_paths
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign
from hpcrun.plan.intake import placeholders

from .conftest import REPO

DOCS = REPO / "docs"
CAMPAIGN_DOC = DOCS / "campaign-spec.md"
PROFILE_DOC = DOCS / "site-profiles.md"
JOB_DOC = DOCS / "generated-job.md"


# ---- key paths of the models -------------------------------------------------------------

def _text(path: Path) -> str:
    assert path.is_file(), f"{path} is missing"
    return path.read_text(encoding="utf-8")


def _missing(paths: List[str], text: str) -> List[str]:
    return [p for p in paths if f"`{p}`" not in text]


def test_walker_sees_nested_lists_dicts_and_aliases():
    spec = set(model_paths(Campaign))
    profile = set(model_paths(SiteProfile))
    assert {"jobs.chains_per_node", "inputs.files[].path", "burst_buffer.stage_in[].source",
            "database.restart.backoff"} <= spec
    assert {"partitions.<name>.max_walltime", "burst_buffer.pools[].granularity",
            "containers.podman-hpc.run_options", "filesystems.<name>.type"} <= profile
    assert "containers.podman_hpc" not in profile


@pytest.mark.parametrize("model, doc", [(Campaign, CAMPAIGN_DOC), (SiteProfile, PROFILE_DOC)],
                         ids=["campaign-spec", "site-profiles"])
def test_every_key_is_documented(model, doc):
    missing = _missing(list(model_paths(model)), _text(doc))
    assert not missing, f"{doc.name} does not document (in backticks): {', '.join(missing)}"


_KEY_HEADING = re.compile(r"^#{2,6} `([^`]+)`\s*$", re.MULTILINE)


@pytest.mark.parametrize("model, doc", [(Campaign, CAMPAIGN_DOC), (SiteProfile, PROFILE_DOC)],
                         ids=["campaign-spec", "site-profiles"])
def test_every_documented_key_exists(model, doc):
    """In the "## Keys" section, a heading that is a backticked key must name a real key."""
    valid = set(model_paths(model))
    m = re.search(r"^## Keys.*?$(.*?)(?=^## )", _text(doc), re.MULTILINE | re.DOTALL)
    assert m, f"{doc.name} has no '## Keys' section"
    headings = _KEY_HEADING.findall(m.group(1))
    key_like = [h for h in headings if re.fullmatch(r"[a-z_][a-z0-9_.<>\[\]-]*", h)]
    assert key_like, f"no key headings found in {doc.name}"
    stale = [h for h in key_like if h not in valid]
    assert not stale, f"{doc.name} documents keys that do not exist: {', '.join(stale)}"


def test_every_placeholder_is_documented():
    text = _text(CAMPAIGN_DOC)
    names = sorted(set(placeholders.VARIABLES) | set(placeholders.LIST_VARIABLES))
    missing = [n for n in names if f"`{{{n}}}`" not in text]
    assert not missing, "campaign-spec.md does not document: " + ", ".join(
        "{" + n + "}" for n in missing)
    for extra in ("`{name}`", "`{env:NAME}`", "`{{`", "`}}`"):
        assert extra in text, f"campaign-spec.md does not document {extra}"


def test_placeholder_contexts_match_the_table():
    """The table's yes/no columns agree with the sets the planner checks against."""
    text = _text(CAMPAIGN_DOC)
    header = next(line for line in text.splitlines() if line.startswith("| placeholder |"))
    columns = [c.strip().strip("`") for c in header.strip("|").split("|")]
    contexts = {"chain.command": placeholders.CHAIN, "merge.command": placeholders.MERGE,
                "qa.command": placeholders.QA, "qa.count_events": placeholders.COUNT,
                "outputs.pattern": placeholders.PATTERN, "finalize.command": placeholders.FINALIZE}
    assert set(contexts) <= set(columns), columns
    rows = 0
    for line in text.splitlines():
        m = re.match(r"^\| `\{([a-z_]+)\}` \|", line)
        if not m:
            continue
        rows += 1
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for context, allowed in contexts.items():
            said = cells[columns.index(context)] == "yes"
            assert said == (m.group(1) in allowed), (
                f"placeholder table: {{{m.group(1)}}} in {context} says "
                f"{'yes' if said else 'no'}, the planner says the opposite")
    assert rows >= len(placeholders.VARIABLES) + len(placeholders.LIST_VARIABLES)


def _exit_codes() -> List[Tuple[str, int]]:
    text = _text(REPO / "templates" / "base.sh.j2").replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("readonly EXIT_"))
    codes = [(name, int(value)) for name, value in re.findall(r"(EXIT_[A-Z_]+)=(\d+)", line)]
    assert codes, "no readonly EXIT_... line in base.sh.j2"
    return codes


def _literal_fail_codes() -> Set[int]:
    text = _text(REPO / "templates" / "base.sh.j2")
    return {int(c) for c in re.findall(r"\bfail (\d+)\b", text)}


def test_every_exit_code_is_documented():
    m = re.search(r"^## Exit codes$(.*?)(?=^## )", _text(JOB_DOC), re.MULTILINE | re.DOTALL)
    assert m, "generated-job.md has no '## Exit codes' section"
    section = m.group(1)
    rows = {int(c): rest for c, rest in re.findall(r"^\| (\d+) \|(.*)$", section, re.MULTILINE)}
    for name, code in _exit_codes():
        assert code in rows, f"generated-job.md has no exit code row for {code} ({name})"
        assert f"`{name}`" in rows[code], f"the exit code row for {code} does not name {name}"
    for code in _literal_fail_codes() | {0}:
        assert code in rows, f"generated-job.md has no exit code row for {code}"


def test_every_shipped_profile_is_documented():
    text = _text(PROFILE_DOC)
    names = sorted(p.stem for p in (REPO / "site-profiles").glob("*.yaml"))
    assert names
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, f"site-profiles.md does not mention: {', '.join(missing)}"


def test_every_template_block_is_documented():
    blocks: Set[str] = set()
    for template in (REPO / "templates").glob("*.sh.j2"):
        blocks |= set(re.findall(r"\{%-?\s*block\s+(\w+)", _text(template)))
    text = _text(PROFILE_DOC)
    missing = sorted(b for b in blocks if f"`{b}`" not in text)
    assert not missing, f"site-profiles.md does not list the template blocks: {', '.join(missing)}"


# ---- the worked examples are valid ---------------------------------------------------------

def _example(doc: Path, name: str) -> str:
    m = re.search(r"<!-- example: " + re.escape(name) + r" -->\n```\w*\n(.*?)```", _text(doc), re.S)
    assert m, f"{doc.name} has no example block '{name}'"
    return m.group(1)


def test_campaign_example_plans(tmp_path, monkeypatch):
    from hpcrun.plan.load import load_plan
    from hpcrun.render.plandir import write_plan

    monkeypatch.setenv("HPCRUN_PROFILE_PATH", "")
    spec = tmp_path / "campaign.yaml"
    spec.write_text(_example(CAMPAIGN_DOC, "campaign"))
    (tmp_path / "raw-files.txt").write_text(_example(CAMPAIGN_DOC, "list_file"))
    plan = load_plan(spec)
    result = write_plan(plan, tmp_path / "plan")
    script = (tmp_path / "plan" / "jobs" / "job00001.sbatch").read_text()
    text = _text(CAMPAIGN_DOC)
    # the lines the doc shows are the lines hpcrun writes
    for line in script.splitlines():
        if line.startswith("#DW "):
            assert line in text, f"campaign-spec.md shows a different directive than: {line}"
    assert "perNodeCache=size=36G" in script and "--mail-type=FAIL" in script
    assert result.manifest["totals"]["jobs"] == 3
    jobs = json.loads((tmp_path / "plan" / "manifest.json").read_text())["jobs"]
    assert jobs[0]["bb_capacity_bytes"] == 20 * 10**9


def test_profile_example_validates(tmp_path, monkeypatch):
    from hpcrun.model.profiles import load_profile

    monkeypatch.setenv("HPCRUN_PROFILE_PATH", str(tmp_path))
    (tmp_path / "mylab.yaml").write_text(_example(PROFILE_DOC, "profile"))
    profile = load_profile("mylab").profile
    assert profile.extends == "generic-apptainer"
    assert set(profile.partitions) == {"compute", "debug", "gpu"}
    assert profile.partitions["compute"].max_walltime == 3 * 86400
    assert profile.partitions["compute"].cores_per_node == 48      # inherited
    assert profile.node_local is not None and profile.node_local.path == "/local"
    assert profile.containers.apptainer is not None
    assert profile.containers.apptainer.exec_options == ["--nv"]    # list replaced whole
    assert profile.signal_before_timeout == 300


# ---- links between the docs ----------------------------------------------------------------

def _anchors(text: str) -> Set[str]:
    """GitHub-style heading slugs plus explicit <a id="..."> anchors."""
    found = set(re.findall(r'<a id="([^"]+)">', text))
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6} (.*)$", line)
        if m:
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return found


def test_links_between_docs_resolve():
    docs = {p.name: _text(p) for p in DOCS.glob("*.md")}
    broken = []
    for name, text in docs.items():
        for target, anchor in re.findall(r"\]\(([\w.-]*\.md)?#([^)]+)\)", text):
            target = target or name
            if target not in docs:
                broken.append(f"{name}: {target} does not exist")
            elif anchor not in _anchors(docs[target]):
                broken.append(f"{name}: no anchor #{anchor} in {target}")
        for target in re.findall(r"\]\(([\w.-]+\.md)\)", text):
            if target not in docs:
                broken.append(f"{name}: {target} does not exist")
    assert not broken, "\n".join(broken)
