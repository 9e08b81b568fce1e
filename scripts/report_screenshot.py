"""Screenshot a ``toolgrpo report`` page in headless Debian chromium (the README's picture).

    python scripts/report_screenshot.py REPORT.html OUT.png [--step N] [--height PX]

Needs playwright (the test extra) and /usr/bin/chromium (``apt-get install chromium``, as
scripts/test.sh does); no browser is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    from toolgrpo.report.browser import CHROMIUM, CHROMIUM_FLAGS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--step", help="the step the trajectory viewer shows (default: the page's)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    args = ap.parse_args(argv)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(args.report.resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        if args.step:
            page.select_option("#step", args.step)
        page.screenshot(path=str(args.out))
        browser.close()
    if errors:
        raise SystemExit(f"the page raised: {errors}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
