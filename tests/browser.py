"""Headless Chromium (Debian's) driven by Playwright, for the web view's tests.

Playwright's own browser download is not used (the machines have no network for it): the
system browser at /usr/bin/chromium is launched with the flags a closed network needs.
Screenshots go to $HPCRUN_TEST_ARTIFACTS (default /tmp/hpcrun-test-artifacts), kept after
the run as the tests' artifacts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def why_not() -> Optional[str]:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is absent (apt-get install chromium; tests/cluster/harness.py install does it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def artifacts() -> Path:
    path = Path(os.environ.get("HPCRUN_TEST_ARTIFACTS", "/tmp/hpcrun-test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_page(url: str, screenshot: str, check) -> Path:
    """Load ``url``, call ``check(page)`` once the page's script has filled it in, save a screenshot."""
    from playwright.sync_api import sync_playwright

    shot = artifacts() / screenshot
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which(CHROMIUM) or CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            errors: list = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.wait_for_selector("body[data-updated]", timeout=20000)   # serve.js ran and fetched the JSON
            check(page)
            page.screenshot(path=str(shot), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
    return shot
