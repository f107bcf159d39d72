"""The docs site (MkDocs, built from docs/ by docs/build_site.py) builds with warnings as errors; its
generated references hold every spec and profile key and the whole Python API; a broken internal
link or anchor fails the build; shell completion works as documented."""

from __future__ import annotations

import html
import importlib.util
import os
import shutil
import subprocess

import pytest

import hpcrun.api as api
from hpcrun.model.reference import model_paths
from hpcrun.model.site import SiteProfile
from hpcrun.model.spec import Campaign

from .conftest import REPO

pytest.importorskip("mkdocs", reason="mkdocs is not installed (the test extra has it)")

spec = importlib.util.spec_from_file_location("build_site", REPO / "docs" / "build_site.py")
build_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_site)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build_site.build(out)
    return out


def _page(site, rel: str) -> str:
    return html.unescape((site / rel).read_text(encoding="utf-8"))


@pytest.mark.parametrize("model, page", [(Campaign, "reference/campaign-keys.html"),
                                         (SiteProfile, "reference/profile-keys.html")])
def test_every_key_is_in_the_generated_reference(site, model, page):
    text = _page(site, page)
    missing = [p for p in model_paths(model) if f"<code>{p}</code>" not in text]
    assert not missing, missing
    assert "campaign-spec.html#inputsfiles" in _page(site, "reference/campaign-keys.html")


def test_the_api_reference_comes_from_the_docstrings(site):
    text = _page(site, "reference/api.html")
    for name in api.__all__:
        assert f"hpcrun.{name}" in text, name
    assert "Validate SPEC, expand it and write the plan directory" in text
    assert "Problems are returned, not raised" in text   # validate()s docstring
    assert "to_pandas" in text and "_repr_html_" in text


def test_the_cli_reference_has_every_command_and_completion(site):
    text = _page(site, "reference/cli.html")
    for words in ("hpcrun plan", "hpcrun iotune run", "hpcrun iotune darshan", "hpcrun profiles list", "hpcrun run"):
        assert f"<code>{words}</code>" in text, words
    assert "_HPCRUN_COMPLETE=bash_source hpcrun" in text


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    page = docs / "xrootd.md"
    page.write_text(page.read_text() + "\n[gone](campaign-spec.md#no-such-section)\n")
    with pytest.raises(SystemExit, match="strict failed"):
        build_site.build(tmp_path / "site", docs)


def test_shell_completion_as_documented():
    exe = shutil.which("hpcrun")
    if exe is None:
        pytest.skip("the hpcrun command is not installed on PATH (pip install -e .)")
    script = subprocess.run([exe], env=dict(os.environ, _HPCRUN_COMPLETE="bash_source"), capture_output=True,
                            text=True, timeout=60).stdout
    assert "_hpcrun_completion()" in script and "complete -o nosort -F _hpcrun_completion hpcrun" in script
    words = subprocess.run([exe], env=dict(os.environ, _HPCRUN_COMPLETE="bash_complete", COMP_WORDS="hpcrun pro",
                                           COMP_CWORD="1"), capture_output=True, text=True, timeout=60).stdout
    assert "plain,profiles" in words
