"""A real PgBouncer (Debian's `pgbouncer` package) in front of a test PostgreSQL.

It runs in the foreground as a child process, with its own config and auth
file in a folder of the caller, on a free loopback port, in transaction
pooling mode. PgBouncer refuses to run as root, so as root it runs as the
account that owns the server's socket folder (it must reach that socket),
else `postgres`, else `nobody`. Its log is its stderr, kept in that folder.

`session_state_errors()` scans logs (PgBouncer's and the workers') for the
errors transaction pooling causes when a client relies on session state:
prepared statements and server-side cursors that live on a server
connection the client no longer has, startup parameters PgBouncer refuses,
and notifications for a LISTEN that went through PgBouncer.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from django_conveyor import embedded
from tests.faults.pg import free_port

POOL_MODE = "transaction"
PASSWORD = "conveyor-pgbouncer"  # What clients give PgBouncer when the server needs none.
MAX_CLIENT_CONN = 500
DEFAULT_POOL_SIZE = 20  # Server connections per (database, user).
SERVER_LOGIN_RETRY_SECONDS = 1  # PgBouncer's default (15) would stall every database restart.
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
RUN_AS = ("postgres", "nobody")  # Accounts to run as when we are root.

SESSION_STATE_ERRORS = re.compile(
    "|".join(
        [
            r"prepared statement \S+ (?:does not exist|already exists)",
            r"unnamed prepared statement does not exist",
            r"cursor \S+ does not exist",  # a server-side cursor left on another connection
            r"portal \S+ does not exist",
            r"bind message supplies \d+ parameters",
            r"unsupported startup parameter",  # PgBouncer refused a client's session setting
            r"unsupported pkt type",
            r"got packet 'A' from server when not linked",  # a NOTIFY for a LISTEN made through it
        ]
    ),
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Upstream:
    """The PostgreSQL that PgBouncer forwards to."""

    host: str  # A host name or address, or a Unix socket folder.
    port: int
    user: str
    password: str | None

    @classmethod
    def from_django(cls, settings: dict[str, Any]) -> Upstream:
        """From a Django DATABASES entry (as django-environ makes them)."""
        return cls(
            host=settings.get("HOST") or "127.0.0.1",
            port=int(settings.get("PORT") or 5432),
            user=settings.get("USER") or embedded.SUPERUSER,
            password=settings.get("PASSWORD") or None,
        )

    def conninfo(self, **extra: Any) -> str:
        """A libpq connection string that bypasses PgBouncer."""
        return make_conninfo(
            host=self.host, port=self.port, user=self.user, password=self.password, **extra
        )


def binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")
    if not found:
        raise RuntimeError(
            "pgbouncer is not installed: apt-get install pgbouncer (.ci/run installs it)."
        )
    return found


def version() -> tuple[int, int]:
    out = subprocess.run([binary(), "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"(\d+)\.(\d+)", out.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def session_state_errors(paths: list[Path]) -> list[str]:
    """Every log line (as `file: line`) that names a session-state error."""
    found = []
    for path in paths:
        with path.open(errors="replace") as lines:
            found += [f"{path.name}: {ln.strip()}" for ln in lines if is_session_state_error(ln)]
    return found


def is_session_state_error(text: str) -> bool:
    return SESSION_STATE_ERRORS.search(text) is not None


class PgBouncer:
    def __init__(self, work_dir: Path, upstream: Upstream, *, pool_mode: str = POOL_MODE) -> None:
        self.work_dir = work_dir
        self.upstream = upstream
        self.pool_mode = pool_mode
        self.port = free_port()
        self.user = upstream.user
        self.password = upstream.password or PASSWORD
        self.log = work_dir / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- addresses -------------------------------------------------------------

    def url(self, dbname: str) -> str:
        """A DATABASE_URL through PgBouncer."""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{dbname}"

    def conninfo(self, dbname: str) -> str:
        return make_conninfo(
            host="127.0.0.1", port=self.port, user=self.user, password=self.password, dbname=dbname
        )

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on the admin console (simple query protocol only)."""
        with (
            psycopg.connect(
                self.conninfo("pgbouncer"), autocommit=True, cursor_factory=psycopg.ClientCursor
            ) as conn,
            conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
        ):
            return cur.execute(f"SHOW {what}").fetchall()

    # -- life cycle ------------------------------------------------------------

    def config(self) -> str:
        lines = [
            "[databases]",
            f"* = host={self.upstream.host} port={self.upstream.port}",
            "",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = scram-sha-256",
            f"auth_file = {self.work_dir / 'userlist.txt'}",
            f"admin_users = {self.user}",
            f"pool_mode = {self.pool_mode}",
            f"max_client_conn = {MAX_CLIENT_CONN}",
            f"default_pool_size = {DEFAULT_POOL_SIZE}",
            f"server_login_retry = {SERVER_LOGIN_RETRY_SECONDS}",
        ]
        if version() >= (1, 21):
            # Newer PgBouncers can track protocol-level prepared statements; turn
            # that off so that any prepared statement still fails loudly here.
            lines.append("max_prepared_statements = 0")
        return "\n".join(lines) + "\n"

    def start(self) -> PgBouncer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        ini = self.work_dir / "pgbouncer.ini"
        ini.write_text(self.config())
        (self.work_dir / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        command = [binary()]
        if (account := run_as(self.upstream.host)) is not None:
            command += ["-u", account]
            # Test-only secrets: readable by the account PgBouncer becomes.
            embedded._grant_traverse(ini)
            for path in (ini, self.work_dir / "userlist.txt"):
                path.chmod(0o644)
        command.append(str(ini))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"PgBouncer did not start ({shlex.join(command)}):\n{tail}")
            time.sleep(0.05)
        return self

    def _listening(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(1)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_SECONDS)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_as(upstream_host: str) -> str | None:
    """The account PgBouncer must switch to: None unless we are root."""
    if os.geteuid() != 0:
        return None
    if upstream_host.startswith("/"):  # It must reach the server's socket folder.
        owner = Path(upstream_host).stat().st_uid
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    for name in RUN_AS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    raise RuntimeError("PgBouncer refuses to run as root and no unprivileged account exists.")
