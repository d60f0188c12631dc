"""Finding and launching the system's Chromium (never a downloaded browser build).

Shared by the browser tests and scripts/console_screenshots.py; imports no Django.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    """CONVEYOR_CHROMIUM, else `chromium` on PATH, else Debian's /usr/bin/chromium."""
    for candidate in (os.environ.get("CONVEYOR_CHROMIUM"), shutil.which("chromium"),
                      "/usr/bin/chromium"):  # fmt: skip
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
