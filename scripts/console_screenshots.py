"""Screenshots of the admin console for docs/admin.md, from a running demo.

    scripts/demo --port 8000 &          # wait for "Serving the shop"
    .venv-3.12/bin/python scripts/console_screenshots.py --url http://127.0.0.1:8000

Drives the system's Chromium (never a downloaded one), logged in as the
demo's admin user, and writes PNGs to docs/images/. It only looks: the
requeue confirmation page is opened, not confirmed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.chromium import CHROMIUM_ARGS, chromium_path  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--user", default="demo")
    parser.add_argument("--password", default="conveyor-demo")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        sys.exit("No Chromium found: install Debian's chromium or set CONVEYOR_CHROMIUM.")
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.url.rstrip("/")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=path, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )  # fmt: skip
        page = browser.new_page()
        page.goto(f"{base}/admin/login/")
        page.fill("#id_username", args.user)
        page.fill("#id_password", args.password)
        page.click("input[type=submit]")
        page.wait_for_url(re.compile(r".*/admin/$"))

        def shot(name: str, url: str, *, full: bool = False) -> None:
            page.goto(base + url)
            page.screenshot(path=str(args.out / f"{name}.png"), full_page=full)
            print(f"wrote {args.out / name}.png")

        shot("console-dashboard", "/admin/conveyor/dashboard/")
        shot("console-dead-letters", "/admin/conveyor/deadletter/")
        page.goto(f"{base}/admin/conveyor/deadletter/")
        dead = page.get_attribute("input[name='_selected_action']", "value")
        shot("console-job-page", f"/admin/conveyor/job/{dead}/change/", full=True)
        shot("console-requeue-confirmation", f"/admin/conveyor/job/{dead}/requeue/")
        shot("console-queues", "/admin/conveyor/queue/")
        shot("console-workers", "/admin/conveyor/worker/")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
