"""The report page in real headless Chromium (Debian's ``chromium``; tier ``browser``): it loads
without console errors, shows the dumped episodes, and a screenshot is taken.

Skipped when Playwright or /usr/bin/chromium is missing, unless TOOLGRPO_REQUIRE_BROWSER=1 (set by
scripts/test.sh, which installs both), where a missing browser fails the tier.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.report.runs import make_run
from toolgrpo.report.browser import CHROMIUM as DEFAULT_CHROMIUM
from toolgrpo.report.browser import CHROMIUM_FLAGS
from toolgrpo.report.html import write_report

pytestmark = pytest.mark.browser
CHROMIUM = os.environ.get("TOOLGRPO_CHROMIUM", DEFAULT_CHROMIUM)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not Path(CHROMIUM).is_file():
        if os.environ.get("TOOLGRPO_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the browser tier needs playwright and {CHROMIUM}")
        pytest.skip(f"needs playwright and {CHROMIUM} (scripts/test.sh installs them)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def test_report_page_loads_and_shows_the_episodes(browser, tmp_path):
    run = make_run(tmp_path, steps=3, group=4, tasks=2)
    page_file = write_report(run)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
    page.goto(page_file.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    assert errors == []
    assert requests == []  # nothing fetched: the page is self-contained
    assert page.inner_text("#step-count") == "10"  # 2 groups x (4 episodes + 1 negative)
    assert page.inner_text("#episode-count") == "5"
    assert page.locator("#episodes .ep").count() == 5
    assert page.locator("#episodes .ep.negative").count() == 1
    assert page.locator("#episodes .trained").count() == 10
    assert page.locator("#episodes .masked").count() == 5
    assert page.locator(".plot svg").count() >= 4
    assert page.evaluate("window.pwned") is None  # tool output shown as text, never run
    # Another step and group: the viewer follows the selection.
    page.select_option("#step", "3")
    page.select_option("#group", "u3-1")
    assert page.locator("#episodes .ep h3").first.inner_text() == "task1 (calculator)"
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if out := os.environ.get("TOOLGRPO_SCREENSHOT_DIR"):  # keep it, e.g. for the README
        shutil.copy(shot, Path(out) / "report.png")
    page.close()
