"""A PostgreSQL that starts itself, so a fresh machine needs only Python.

The example project and the test suite call :func:`database_url` from their
settings.  With ``DATABASE_URL`` set, that server is used.  Otherwise a server
is started (or reused) in a data folder of the project, from the binaries in
the ``pgserver`` wheel (extra ``embedded``; CPython <= 3.12), else those on
the machine (``pg_ctl`` on PATH, ``pg_config --bindir``, Debian's
``/usr/lib/postgresql/*/bin``), else :class:`ImproperlyConfigured` says what
to install.  PostgreSQL refuses to run as root, so as root it runs as the
``postgres`` account (or pgserver's own ``pgserver`` account).

pgserver's binaries are driven directly, not through ``pgserver.get_server()``:
that always passes ``-h ''`` (no TCP, which the fault harness needs) and
re-owns the folder to its own account; one code path gives one lock, one
owner and one way to stop whichever binaries started the server.  The server
outlives the process so test runs, web server and workers share it.

From a shell: ``python -m django_conveyor.embedded start|url|stop DIR`` (see
:func:`main`) starts a development server and prints its URL, prints the URL
of the one running in DIR, or stops it.

For a Unix socket the URL carries the socket folder in django-environ's form,
``postgresql://postgres@:5432/%2Fdir/postgres`` -> ``HOST='/dir'`` (it
leaves a percent-encoded host undecoded).  libpq would read that path as a
database name: hand libpq tools the Django settings or a ``tcp_port`` URL.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import importlib.util
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

SUPERUSER = "postgres"  # the role initdb creates; local connections are trusted
DATABASE = "postgres"
SOCKET_PORT = 5432  # names the socket file when no TCP port is asked for
MIN_MAJOR = 14
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
SERVER_USERS = ("postgres",)  # unprivileged accounts to run as when we are root
PGSERVER_USER = "pgserver"  # the account pgserver itself creates when run as root
BINARIES = ("pg_ctl", "initdb", "postgres")
StrPath = str | os.PathLike[str]


@dataclass(frozen=True)
class _Server:  # what postmaster.pid says about a running server
    pid: int
    port: int
    socket_dir: str  # empty when the server has no Unix socket
    listen: str  # first TCP listen address, empty for sockets only


def database_url(data_dir: StrPath, *, tcp_port: int | None = None) -> str:
    """Return ``DATABASE_URL`` if set, else :func:`start` the server in *data_dir*."""
    return os.environ.get("DATABASE_URL") or start(data_dir, tcp_port=tcp_port)


def start(data_dir: StrPath, *, tcp_port: int | None = None) -> str:
    """Start (or reuse) the server whose data folder is *data_dir*; return its URL.

    With *tcp_port* the server also listens on 127.0.0.1:*tcp_port* and the
    URL points there.  Safe to call from many processes at once: a file lock
    beside the folder serialises initdb and start, and a running server is
    reused.  ``DATABASE_URL`` is not consulted (harnesses need their own server).
    """
    data = Path(data_dir).expanduser().resolve()
    data.parent.mkdir(parents=True, exist_ok=True)
    with _locked(data):
        server = _running(data)
        if server is None:
            server = _start(data, tcp_port)
        elif tcp_port is not None and (server.listen != "127.0.0.1" or server.port != tcp_port):
            raise ImproperlyConfigured(
                f"The PostgreSQL in {data} is already running without TCP port {tcp_port}; "
                "stop it first (django_conveyor.embedded.stop) or use another data folder."
            )
    return _url(server, tcp=tcp_port is not None)


def running_url(data_dir: StrPath) -> str | None:
    """The URL of the server running in *data_dir*, or None; starts nothing."""
    data = Path(data_dir).expanduser().resolve()
    if not data.is_dir():
        return None
    with _locked(data):
        server = _running(data)
    return None if server is None else _url(server, tcp=server.listen == "127.0.0.1")


def _url(server: _Server, *, tcp: bool) -> str:
    if tcp or not server.socket_dir:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{server.port}/{DATABASE}"
    return f"postgresql://{SUPERUSER}@:{server.port}/{quote(server.socket_dir, safe='')}/{DATABASE}"


def stop(data_dir: StrPath, timeout: float = 60.0, *, immediate: bool = False) -> bool:
    """Stop the server of *data_dir*; False if none was running.

    The default is PostgreSQL's "fast" shutdown (clients cut off, clean
    checkpoint); *immediate* skips the checkpoint, like a crash, so the next
    start runs crash recovery.
    """
    data = Path(data_dir).expanduser().resolve()
    if not data.is_dir():
        return False
    with _locked(data):
        # Only a server that answers is signalled: a stale pid may be reused.
        if (server := _running(data)) is None:
            return False
        logger.info("stopping PostgreSQL in %s (pid %d)", data, server.pid)
        os.kill(server.pid, signal.SIGQUIT if immediate else signal.SIGINT)
        deadline = time.monotonic() + timeout
        # The pid file goes at the end of shutdown; watching it too copes
        # with an unreaped (zombie) postmaster, which still "exists".
        while _alive(server.pid) and (data / "postmaster.pid").exists():
            if time.monotonic() > deadline:
                os.kill(server.pid, signal.SIGKILL if immediate else signal.SIGQUIT)
                break
            time.sleep(0.05)
        return True


@contextmanager
def _locked(data: Path) -> Iterator[None]:
    # The lock lives beside the folder, not in it: initdb refuses a non-empty folder.
    with open(data.parent / f".{data.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _running(data: Path) -> _Server | None:
    """The server described by postmaster.pid, if it is up and accepting connections."""
    try:
        lines = [line.strip() for line in (data / "postmaster.pid").read_text().split("\n")]
        server = _Server(int(lines[0]), int(lines[3]), socket_dir=lines[4], listen=lines[5])
    except (OSError, ValueError, IndexError):
        return None
    if lines[7:8] != ["ready"] or not _alive(server.pid):
        return None
    if server.socket_dir:
        family, address = socket.AF_UNIX, f"{server.socket_dir}/.s.PGSQL.{server.port}"
    else:
        family, address = socket.AF_INET, (server.listen or "127.0.0.1", server.port)
    # A bare connect proves the postmaster listens, uses no backend slot, and
    # is not logged by PostgreSQL when no bytes are sent.
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(address)
        except OSError:
            return None
    logger.debug("reusing PostgreSQL in %s: %s", data, server)
    return server


def _bindir_candidates() -> list[Path]:
    found: list[Path] = []
    try:
        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    if pg_ctl := shutil.which("pg_ctl"):
        found.append(Path(pg_ctl).resolve().parent)
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            found.append(Path(out.stdout.strip()))
    versions = sorted(glob.glob(DEBIAN_BINDIRS), key=lambda p: int(re.sub(r"\D", "", p) or 0))
    found += [Path(p) for p in reversed(versions)]
    usable = [d for d in found if all(os.access(d / b, os.X_OK) for b in BINARIES)]
    return list(dict.fromkeys(usable))


def _major(bindir: Path) -> int:
    out = subprocess.run([bindir / "postgres", "--version"], capture_output=True, text=True)
    match = re.search(r"\)\s*(\d+)", out.stdout)
    return int(match.group(1)) if match else 0


def _pick_bindir(data: Path) -> Path:
    """Binaries of the folder's PostgreSQL major version, or the first usable ones."""
    candidates = [(d, _major(d)) for d in _bindir_candidates()]
    candidates = [(d, v) for d, v in candidates if v >= MIN_MAJOR]
    if not candidates:
        raise ImproperlyConfigured(
            f"No embedded PostgreSQL could be started for {data}: the 'pgserver' package is "
            "not installed (pip install 'django-conveyor[embedded]', Python 3.12 or older) and "
            f"no PostgreSQL {MIN_MAJOR}+ server binaries (pg_ctl, initdb, postgres) were found on "
            "PATH, through pg_config or in /usr/lib/postgresql/*/bin. Install one of them, or set "
            f"DATABASE_URL to a PostgreSQL {MIN_MAJOR}+ server, e.g. "
            "DATABASE_URL=postgresql://user:password@localhost:5432/dbname"
        )
    version_file = data / "PG_VERSION"
    if not version_file.exists():
        return candidates[0][0]
    wanted = int(version_file.read_text().strip().split(".")[0])
    for bindir, major in candidates:
        if major == wanted:
            return bindir
    raise ImproperlyConfigured(
        f"{data} holds a PostgreSQL {wanted} cluster but only binaries for "
        f"{sorted({v for _, v in candidates})} were found; delete the folder to start afresh."
    )


def _server_user(data: Path, bindir: Path) -> pwd.struct_passwd | None:
    """The account to run PostgreSQL as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    if (data / "PG_VERSION").exists() and data.stat().st_uid != 0:
        return pwd.getpwuid(data.stat().st_uid)
    for name in SERVER_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
    if "pginstall" in bindir.parts:  # as pgserver does itself when run as root
        try:
            return pwd.getpwnam(PGSERVER_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", PGSERVER_USER], check=True, capture_output=True)
            return pwd.getpwnam(PGSERVER_USER)
    raise ImproperlyConfigured(
        "PostgreSQL refuses to run as root and there is no unprivileged 'postgres' user to run "
        "it as; create one (useradd --system postgres), run as another user, or set DATABASE_URL."
    )


def _grant_traverse(path: Path) -> None:
    """Let the server's account reach *path*: add o+x to parents that lack it."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            logger.info("chmod o+x %s so the PostgreSQL user can reach its files", parent)
            parent.chmod(mode | 0o001)


def _run(cmd: list[str], user: pwd.struct_passwd | None, data: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    ids = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    # Output goes to a file: the postmaster that pg_ctl forks would keep a pipe open.
    # A session of its own keeps a Ctrl-C in the caller's terminal from reaching it.
    with tempfile.TemporaryFile("w+") as out:
        io = {"stdin": subprocess.DEVNULL, "stdout": out, "stderr": subprocess.STDOUT}
        proc = subprocess.run(cmd, cwd=data, env=env, start_new_session=True, **io, **ids)
        if proc.returncode != 0:
            out.seek(0)
            log = data / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ImproperlyConfigured(
                f"Embedded PostgreSQL: {shlex.join(cmd)} failed ({proc.returncode}):\n"
                f"{out.read()}\n{tail}"
            )


def _socket_dir(data: Path, port: int, user: pwd.struct_passwd | None) -> Path:
    """The data folder, unless its socket path would exceed the ~107-byte limit."""
    if len(f"{data}/.s.PGSQL.{port}.lock") < 100:
        return data
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    short = Path(tempfile.gettempdir()) / f"conveyor-pg-{digest}"
    short.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        os.chown(short, user.pw_uid, user.pw_gid)
    return short


def _start(data: Path, tcp_port: int | None) -> _Server:
    bindir = _pick_bindir(data)
    user = _server_user(data, bindir)
    data.mkdir(mode=0o700, exist_ok=True)
    if user is not None:
        _grant_traverse(data)
        _grant_traverse(bindir)
        if not (data / "PG_VERSION").exists():
            os.chown(data, user.pw_uid, user.pw_gid)
    if not (data / "PG_VERSION").exists():
        if any(data.iterdir()):
            raise ImproperlyConfigured(f"{data} is not empty and holds no PostgreSQL cluster.")
        logger.info("initdb %s with %s", data, bindir)
        flags = f"-U {SUPERUSER} --auth=trust --encoding=UTF8 --no-locale --no-sync".split()
        _run([str(bindir / "initdb"), "-D", str(data), *flags], user, data)
    port = tcp_port or SOCKET_PORT
    sockets = _socket_dir(data, port, user)
    options = ["-k", str(sockets), "-p", str(port), "-h", "127.0.0.1" if tcp_port else ""]
    logger.info("starting PostgreSQL in %s (socket %s, tcp %s)", data, sockets, tcp_port)
    log = str(data / "server.log")
    pg_ctl = [str(bindir / "pg_ctl"), "start", "-w", "-t", "120", "-D", str(data), "-l", log]
    _run([*pg_ctl, "-o", shlex.join(options)], user, data)
    server = _running(data)
    if server is None:
        raise ImproperlyConfigured(f"PostgreSQL in {data} started but does not answer.")
    return server


def main(argv: list[str] | None = None) -> int:
    """``python -m django_conveyor.embedded start|url|stop DIR``: a development database.

    ``start`` starts (or reuses) the server of DIR and prints its URL, the
    only line on stdout, so ``export DATABASE_URL="$(... start DIR)"`` works;
    ``url`` prints the URL of the server running there (exit 1 if none);
    ``stop`` stops it (exit 0 whether or not one was running).
    """
    parser = argparse.ArgumentParser(
        prog="python -m django_conveyor.embedded",
        description="Start, locate or stop a development PostgreSQL whose data lives in DIR.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start_cmd = sub.add_parser("start", help="Start (or reuse) the server of DIR; print its URL.")
    start_cmd.add_argument("dir", type=Path, help="Data folder (created if missing).")
    start_cmd.add_argument(
        "--port",
        type=int,
        default=None,
        help="Also listen on 127.0.0.1:PORT and print a TCP URL (default: a Unix socket only).",
    )
    url_cmd = sub.add_parser("url", help="Print the URL of the server running in DIR.")
    url_cmd.add_argument("dir", type=Path)
    stop_cmd = sub.add_parser("stop", help="Stop the server of DIR.")
    stop_cmd.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.command == "start":
        try:
            print(start(args.dir, tcp_port=args.port))
        except ImproperlyConfigured as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "url":
        if (url := running_url(args.dir)) is None:
            print(f"error: no PostgreSQL is running in {args.dir}", file=sys.stderr)
            return 1
        print(url)
        return 0
    if not stop(args.dir):
        print(f"no PostgreSQL was running in {args.dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
