#!/usr/bin/env python3
"""Build the documentation site: the pages in docs/ plus references generated from the code.

    python3 docs/build_site.py [--out DIR]          # default: ./site

Generated at build time, never written by hand (so they cannot drift): every campaign-spec and
site-profile key from the models (type, default, description), the Python API from its
docstrings, and the command line from its --help texts. MkDocs builds with --strict and link
validation on, so a warning (a broken internal link or anchor, a page left out) fails the build.
"""

from __future__ import annotations

import argparse
import inspect
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Set

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))

# The decisions' pages, one a room of the package, in the order of the layers (docs/architecture.md)
DECISION_ROOMS = [
    ("model", "model/: loading and validating"), ("plan", "plan/: planning"),
    ("job", "render/ and templates/: the generated job"), ("backends", "backends/"), ("store", "store/"),
    ("operate:submission", "submission/"), ("operate:tracking", "tracking/"), ("operate:retries", "retries/"),
    ("operate:supervision", "supervision/"), ("operate:outputs", "outputs/"), ("operate:campaign", "campaign/"),
    ("report", "report/"), ("iotune", "iotune/"), ("interface", "api.py, cli/, docs and tests"),
]

NAV = [
    {"Home": "index.md"},
    {"Guides": [{"Campaign spec": "campaign-spec.md"}, {"Site profiles": "site-profiles.md"},
                {"The generated job": "generated-job.md"}, {"Inputs on XRootD": "xrootd.md"},
                {"I/O tuning": "iotune.md"}, {"Operations": "operations.md"},
                {"Campaigns over time": "campaigns-over-time.md"}, {"Budgets and forecasts": "forecast.md"},
                {"Several clusters": "clusters.md"}, {"Late binding": "late-binding.md"},
                {"Security": "security.md"}]},
    {"Reference": [{"Campaign spec keys": "reference/campaign-keys.md"},
                   {"Site profile keys": "reference/profile-keys.md"},
                   {"Python API": "reference/api.md"}, {"Command line": "reference/cli.md"}]},
    {"Design": [{"Architecture": "architecture.md"}, {"Decisions": [
        {"By room": "decisions.md"},
        *[{title: f"decisions/{slug}.md"} for slug, title in DECISION_ROOMS if not slug.startswith("operate:")],
        {"operate/": [{title: f"decisions/{slug[8:]}.md"} for slug, title in DECISION_ROOMS
                      if slug.startswith("operate:")]}]}]},
]

CONFIG = """site_name: hpcrun
docs_dir: {docs}
site_dir: {site}
use_directory_urls: false
nav: {nav}
markdown_extensions:
  - toc:
      permalink: false
  - tables
  - fenced_code
validation:
  omitted_files: warn
  absolute_links: warn
  unrecognized_links: warn
  anchors: warn
"""


def anchors_of(page: Path) -> Set[str]:
    from hpcrun.model.reference import slug
    return {slug(m.group(1).replace("`", "")) for m in re.finditer(r"^#+ (.+?)\s*$", page.read_text(), re.MULTILINE)}


def key_references(stage: Path) -> None:
    from hpcrun.model.reference import markdown
    from hpcrun.model.site import SiteProfile
    from hpcrun.model.spec import Campaign
    (stage / "reference").mkdir()
    for name, title, model, page in (
            ("campaign-keys.md", "Campaign spec keys", Campaign, "campaign-spec.md"),
            ("profile-keys.md", "Site profile keys", SiteProfile, "site-profiles.md")):
        intro = (f"Every key the model accepts, generated from the code at build time. The sections of "
                 f"[{page}](../{page}) explain each one; keys link to them.")
        text = markdown(title, intro, model, f"../{page}", anchors_of(stage / page))
        (stage / "reference" / name).write_text(text)


def api_reference() -> str:
    import hpcrun.api as api
    out: List[str] = ["# Python API", "", "Generated from the docstrings of `hpcrun/api.py`.", "",
                      _clean(api.__doc__ or ""), ""]
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isfunction(obj):
            out += [f"## `hpcrun.{name}{inspect.signature(obj)}`".replace("'", ""), "", _clean(obj.__doc__ or ""), ""]
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isclass(obj) and name != "Error":
            out += [f"## `hpcrun.{name}`", "", _clean(obj.__doc__ or ""), ""]
            for meth, fn in inspect.getmembers(obj, inspect.isfunction):
                if not meth.startswith("_") or meth == "_repr_html_":
                    doc = _clean(fn.__doc__ or "")
                    out += [f"- `{meth}{inspect.signature(fn)}`" + (f": {doc}" if doc else "")]
            out.append("")
    out += ["## `hpcrun.Error`", "", "Raised for bad input (exit code 2 on the command line): `.problems` "
            "lists file, line, key and message.", ""]
    return "\n".join(out)


def _clean(doc: str) -> str:
    return inspect.cleandoc(doc).replace("<", "&lt;").replace(">", "&gt;") if doc else ""


def cli_reference() -> str:
    import click

    from hpcrun.cli import main
    out = ["# Command line", "", "Generated from `hpcrun --help` and each command's help.", "",
           "## Shell completion", "",
           "Click provides it; add one line to your shell's start-up file:", "",
           "```sh", 'eval "$(_HPCRUN_COMPLETE=bash_source hpcrun)"   # ~/.bashrc',
           'eval "$(_HPCRUN_COMPLETE=zsh_source hpcrun)"    # ~/.zshrc',
           "_HPCRUN_COMPLETE=fish_source hpcrun | source     # ~/.config/fish/completions/hpcrun.fish", "```", ""]

    def walk(cmd: click.Command, path: List[str], parent: click.Context = None) -> None:
        ctx = click.Context(cmd, info_name=path[-1], parent=parent, terminal_width=100, max_content_width=100)
        out.extend([f"## `{' '.join(path)}`", "", "```text", cmd.get_help(ctx), "```", ""])
        if isinstance(cmd, click.Group):
            for name in sorted(cmd.list_commands(ctx)):   # a group may register its commands when first used
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, path + [name], ctx)
    walk(main, ["hpcrun"])
    return "\n".join(out)


def need_mkdocs() -> None:
    """Stop with the install that brings MkDocs (the ``docs`` extra) when it is missing."""
    import importlib.util
    if importlib.util.find_spec("mkdocs") is None:
        raise SystemExit("docs site: MkDocs is not installed; install the docs extra: "
                         "python3 -m pip install -e '.[docs]' (from the checkout)")


def build(site: Path, docs: Path = DOCS) -> None:
    """Stage ``docs``' pages and the generated references, then build the site with MkDocs (strict)."""
    need_mkdocs()
    with tempfile.TemporaryDirectory(prefix="hpcrun-docs-") as tmp:
        stage = Path(tmp) / "docs"
        stage.mkdir()
        for page in docs.glob("*.md"):
            shutil.copy(page, stage / page.name)
        shutil.copytree(docs / "decisions", stage / "decisions")
        key_references(stage)
        (stage / "reference" / "api.md").write_text(api_reference())
        (stage / "reference" / "cli.md").write_text(cli_reference())
        import json
        config = Path(tmp) / "mkdocs.yml"
        config.write_text(CONFIG.format(docs=stage, site=site.resolve(), nav=json.dumps(NAV)))
        done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(config)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"docs site: mkdocs build --strict failed (exit {done.returncode})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="site", help="site directory (default ./site)")
    args = ap.parse_args()
    build(Path(args.out))
    print(f"docs site written to {Path(args.out).resolve()}")


if __name__ == "__main__":
    main()
