"""HTTP enqueue throughput: POST /conveyor/api/jobs against one process of the example shop.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/api_http.py \\
        [--requests 5000] [--concurrency 8] [--out docs/results]

Needs `gunicorn` in the virtualenv (`pip install gunicorn`) and `hey` on PATH
(Debian: `apt-get install hey`); neither is a dependency of the project.
Builds a scratch database `conveyor_http` on the suite's PostgreSQL, serves
the example shop with `gunicorn --workers 1` (one sync process) on
127.0.0.1, creates an API key, and has hey send bounded bursts of requests:

- new jobs (no Idempotency-Key): each request inserts a job (201);
- replays (one fixed Idempotency-Key): each request finds the same job (200).

No worker runs, so the figure is the enqueue path alone. Writes
`api-http-<date>.json` to --out; the database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scratch  # noqa: E402  (beside this script)

DATABASE = "conveyor_http"
BODY = json.dumps({"task": "shop.tasks.send_receipt", "args": [1]})


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def database_url() -> str:
    """DATABASE_URL for the scratch database on the suite's server."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.db import connection

    scratch.recreate(DATABASE)
    s = connection.settings_dict
    port = s.get("PORT") or 5432
    if not s.get("HOST") or s["HOST"].startswith("/"):
        host = quote(s["HOST"] or "", safe="")
        return f"postgresql://{quote(s['USER'])}@:{port}/{host}/{DATABASE}"
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgresql://{quote(s['USER'])}{password}@{s['HOST']}:{port}/{DATABASE}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "example_project/manage.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def hey(url: str, key: str, requests: int, concurrency: int, extra: list[str]) -> dict[str, object]:
    done = subprocess.run(
        ["hey", "-n", str(requests), "-c", str(concurrency), "-m", "POST",
         "-T", "application/json", "-H", f"Authorization: Bearer {key}", *extra,
         "-d", BODY, url],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    out = done.stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    codes = dict(re.findall(r"\[(\d{3})\]\s+(\d+) responses", out))
    p50 = re.search(r"50% in ([\d.]+) secs", out)
    p99 = re.search(r"99% in ([\d.]+) secs", out)
    return {
        "requests_per_second": round(rate, 1),
        "status_codes": {k: int(v) for k, v in codes.items()},
        "p50_ms": round(float(p50.group(1)) * 1000, 1) if p50 else None,
        "p99_ms": round(float(p99.group(1)) * 1000, 1) if p99 else None,
    }


def main() -> int:
    args = parse_args()
    for tool in ("hey", "gunicorn"):
        if not shutil.which(tool) and not (Path(sys.executable).parent / tool).exists():
            sys.exit(f"{tool} is needed: see the docstring of this script.")
    env = {**os.environ, "DATABASE_URL": database_url(), "DEBUG": "false"}
    env["DJANGO_SETTINGS_MODULE"] = "shop_site.settings"
    env["PYTHONPATH"] = str(REPO / "example_project")
    server = None
    try:
        manage(env, "migrate", "--verbosity", "0")
        key = manage(env, "conveyor_api_key", "create", "bench", "--scopes", "enqueue").strip()
        port = free_port()
        gunicorn = Path(sys.executable).parent / "gunicorn"
        server = subprocess.Popen(
            [str(gunicorn), "--workers", "1", "--bind", f"127.0.0.1:{port}",
             "--log-level", "warning", "shop_site.wsgi:application"],
            cwd=REPO / "example_project", env=env,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/conveyor/api/jobs"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/conveyor/api/openapi.json")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        hey(url, key, 200, args.concurrency, [])  # warm-up: connections, caches
        result = {
            "date": dt.date.today().isoformat(),
            "server": "gunicorn --workers 1 (sync), example shop, DEBUG off",
            "requests": args.requests,
            "concurrency": args.concurrency,
            "new_jobs": hey(url, key, args.requests, args.concurrency, []),
            "replays": hey(
                url, key, args.requests, args.concurrency, ["-H", "Idempotency-Key: bench-replay"]
            ),
            "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at end",
        }
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        scratch.drop(DATABASE)
    scratch.report(result, args.out, "api-http")
    return 0


if __name__ == "__main__":
    sys.exit(main())
