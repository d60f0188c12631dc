"""PostgreSQL and Redis for a benchmark run, plus the process bookkeeping.

The parent stays standard-library only, so SQL is run through a system
venv's interpreter (every PostgreSQL system's venv has psycopg).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_SQL = """
import json, sys, psycopg
url, stmts = sys.argv[1], json.loads(sys.argv[2])
out = []
with psycopg.connect(url, autocommit=True) as conn:
    for s in stmts:
        cur = conn.execute(s)
        out.append([list(map(str, r)) for r in cur.fetchall()] if cur.description else None)
print(json.dumps(out))
"""


def run_sql(py: Path, url: str, *stmts: str) -> list[list[list[str]] | None]:
    out = subprocess.run(
        [str(py), "-c", _SQL, url, json.dumps(list(stmts))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr else "sql failed")
    return json.loads(out.stdout)


def with_dbname(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class Postgres:
    """DATABASE_URL's server, else one started via django_conveyor.embedded."""

    url: str
    data_dir: Path | None = None  # set when this run started the server
    stopper: Path | None = None  # venv python that can import django_conveyor
    data_dir_any: Path | None = None  # the embedded server's folder, whoever started it

    @classmethod
    def start(cls, conveyor_py: Path | None, data_dir: Path, port: int) -> Postgres:
        if os.environ.get("DATABASE_URL"):
            return cls(os.environ["DATABASE_URL"])
        if conveyor_py is None:
            raise RuntimeError("no DATABASE_URL and no conveyor venv to start PostgreSQL with")
        already = (data_dir / "postmaster.pid").exists()
        code = (
            "import sys\nfrom django_conveyor.embedded import database_url\n"
            "print(database_url(sys.argv[1], tcp_port=int(sys.argv[2])))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        out = subprocess.run(
            [str(conveyor_py), "-c", code, str(data_dir), str(port)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()[-3:]
            raise RuntimeError("embedded PostgreSQL failed: " + " | ".join(tail))
        url = out.stdout.strip().splitlines()[-1]
        return cls(url, None if already else data_dir, conveyor_py, data_dir)

    def stop(self) -> None:
        if self.data_dir is None or self.stopper is None:
            return
        code = "import sys\nfrom django_conveyor.embedded import stop\nstop(sys.argv[1])\n"
        subprocess.run(
            [str(self.stopper), "-c", code, str(self.data_dir)], capture_output=True, timeout=120
        )
        self.data_dir = None


def find_redis(install: bool, log: Path) -> tuple[str | None, str]:
    """Path to redis-server, installing Debian's package when allowed; else a reason."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if found:
        return found, ""
    if not install:
        return None, "redis-server not found (and --no-install-redis given)"
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "redis-server not found and apt-get unavailable (not root or not Debian)"
    with log.open("ab") as out:
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "redis-server"]):
            rc = subprocess.run(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
            ).returncode
            if rc != 0:
                return None, f"`{' '.join(argv)}` failed with exit code {rc}"
    found = shutil.which("redis-server")
    return (found, "") if found else (None, "redis-server still missing after apt-get install")


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class Processes:
    """Every process group the parent started, so exit and Ctrl-C clean up."""

    groups: list[int] = field(default_factory=list)
    pgid_files: list[Path] = field(default_factory=list)

    def spawn(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.groups.append(proc.pid)
        return proc

    def kill_group(self, pgid: int, sig: int = signal.SIGTERM) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def cleanup(self) -> None:
        groups = list(self.groups)
        for path in self.pgid_files:  # worker groups the adapters started
            with contextlib.suppress(OSError, ValueError):
                groups += [int(x) for x in path.read_text().split()]
        for pgid in groups:
            self.kill_group(pgid, signal.SIGTERM)
        time.sleep(0.5)
        for pgid in groups:
            self.kill_group(pgid, signal.SIGKILL)
        self.groups.clear()


def start_redis(binary: str, port: int, procs: Processes, log: Path) -> subprocess.Popen[bytes]:
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]
    proc = procs.spawn(argv, log)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if redis_ping(port):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"redis-server did not answer on 127.0.0.1:{port}")


def redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    for token in out.stdout.split():
        if token.startswith("v="):
            return token[2:]
    return out.stdout.strip()
