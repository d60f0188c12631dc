"""The embedded PostgreSQL default (DESIGN §7), against real servers.

Each test that needs a server starts its own in a temporary folder and stops
it afterwards, so these tests never touch the suite's database (or Django's
test database) and pass whether or not DATABASE_URL is set.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import environ
import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import ConnectionHandler

from django_conveyor import embedded


@pytest.fixture(autouse=True)
def _no_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)


@pytest.fixture
def new_data_dir() -> Iterator[Callable[..., Path]]:
    """Hands out fresh data folders; stops their servers and deletes them after.

    Not under pytest's tmp_path: as root the server runs as another account
    that must traverse the folder's parents, and every new pytest session
    makes pytest's temporary root private to its owner again.
    """
    made: list[Path] = []

    def make(name: str = "pg") -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="conveyor-embedded-")) / name)
        return made[-1]

    yield make
    for data in made:
        embedded.stop(data)
        shutil.rmtree(data.parent, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _django_select_1(url: str) -> int:
    """Connect the way Django would, from the settings django-environ makes of *url*."""
    handler = ConnectionHandler({"default": environ.Env.db_url_config(url)})
    wrapper = handler["default"]
    raw = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        return raw.execute("SELECT 1").fetchone()[0]
    finally:
        raw.close()


def test_database_url_passes_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db.example:6543/app")
    assert embedded.database_url(tmp_path / "pg") == "postgresql://u:p@db.example:6543/app"
    assert not (tmp_path / "pg").exists()


def test_starts_a_server_that_django_settings_reach(new_data_dir) -> None:
    data = new_data_dir()
    url = embedded.database_url(data)

    config = environ.Env.db_url_config(url)
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert config["HOST"] == str(data.resolve())  # the Unix socket's folder
    assert (config["NAME"], config["USER"], config["PORT"]) == ("postgres", "postgres", 5432)
    assert _django_select_1(url) == 1

    # env.db() (the usual settings idiom) reads the same thing from the environment.
    env = environ.Env()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONVEYOR_TEST_URL", url)
        assert env.db("CONVEYOR_TEST_URL")["HOST"] == str(data.resolve())

    # A second call (a second process in real life) reuses the running server.
    pid = (data / "postmaster.pid").read_text().split()[0]
    assert embedded.database_url(data) == url
    assert (data / "postmaster.pid").read_text().split()[0] == pid


def test_stop_then_restart_keeps_the_data(new_data_dir) -> None:
    data = new_data_dir()
    url = embedded.database_url(data)
    config = environ.Env.db_url_config(url)
    params = {"host": config["HOST"], "port": config["PORT"], "user": "postgres"}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (42)")

    assert embedded.stop(data) is True
    assert not (data / "postmaster.pid").exists()
    assert embedded.stop(data) is False
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dbname="postgres", connect_timeout=2, **params).close()

    assert embedded.database_url(data) == url
    with psycopg.connect(dbname="postgres", **params) as conn:
        assert conn.execute("SELECT n FROM kept").fetchone() == (42,)

    # An immediate stop is a crash to PostgreSQL: the restart recovers from WAL.
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute("INSERT INTO kept VALUES (43)")
    assert embedded.stop(data, immediate=True) is True
    assert embedded.database_url(data) == url
    with psycopg.connect(dbname="postgres", **params) as conn:
        assert conn.execute("SELECT sum(n) FROM kept").fetchone() == (85,)


def test_tcp_port_listens_on_loopback(new_data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    data = new_data_dir()
    port = _free_port()
    # start() is for harnesses that need their own server: it ignores DATABASE_URL.
    monkeypatch.setenv("DATABASE_URL", "postgresql://elsewhere.invalid/db")
    url = embedded.start(data, tcp_port=port)
    monkeypatch.delenv("DATABASE_URL")
    assert url == f"postgresql://postgres@127.0.0.1:{port}/postgres"
    assert _django_select_1(url) == 1

    # Callers without tcp_port (e.g. workers) reuse it through its socket.
    socket_url = embedded.database_url(data)
    assert environ.Env.db_url_config(socket_url)["PORT"] == port
    assert _django_select_1(socket_url) == 1

    with pytest.raises(ImproperlyConfigured, match="already running"):
        embedded.database_url(data, tcp_port=_free_port())


def test_long_folder_path_uses_a_short_socket_folder(new_data_dir) -> None:
    data = new_data_dir("x" * 110)
    url = embedded.database_url(data)
    host = environ.Env.db_url_config(url)["HOST"]
    assert host != str(data.resolve()) and len(host) < 60
    assert _django_select_1(url) == 1
    embedded.stop(data)
    shutil.rmtree(host, ignore_errors=True)


def test_concurrent_first_calls_share_one_server(new_data_dir) -> None:
    data = new_data_dir()
    code = "import sys, django_conveyor.embedded as e; print(e.database_url(sys.argv[1]))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    urls = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert len(urls) == 1
    assert _django_select_1(urls.pop()) == 1


def test_clear_error_when_no_postgresql_is_available(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as if not installed
    monkeypatch.setattr(embedded, "DEBIAN_BINDIRS", str(tmp_path / "none" / "*" / "bin"))

    with pytest.raises(ImproperlyConfigured) as excinfo:
        embedded.database_url(tmp_path / "pg")
    message = str(excinfo.value)
    assert "No embedded PostgreSQL could be started" in message
    assert "pgserver" in message and "DATABASE_URL" in message


def test_local_binaries_serve_without_pgserver(
    new_data_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as on Python 3.13+
    if not embedded._bindir_candidates():
        pytest.skip("no PostgreSQL binaries on this machine")
    data = new_data_dir()
    assert _django_select_1(embedded.database_url(data)) == 1


def test_root_without_an_unprivileged_account_is_told_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root needs another account to run PostgreSQL")
    monkeypatch.setitem(sys.modules, "pgserver", None)
    if not embedded._bindir_candidates():
        pytest.skip("no PostgreSQL binaries on this machine")
    monkeypatch.setattr(embedded, "SERVER_USERS", ("conveyor-no-such-user",))
    with pytest.raises(ImproperlyConfigured, match="refuses to run as root"):
        embedded.database_url(tmp_path / "pg")


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django_conveyor.embedded", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_command_line_starts_locates_and_stops_a_development_server(new_data_dir) -> None:
    data = new_data_dir()
    started = _cli("start", data)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()  # the only line on stdout: `export DATABASE_URL="$(...)"`
    assert url == embedded.running_url(data)
    assert _django_select_1(url) == 1

    located = _cli("url", data)
    assert (located.returncode, located.stdout.strip()) == (0, url)

    stopped = _cli("stop", data)
    assert stopped.returncode == 0, stopped.stderr
    assert not (data / "postmaster.pid").exists()
    gone = _cli("url", data)
    assert gone.returncode == 1
    assert gone.stdout == ""
    assert f"no PostgreSQL is running in {data}" in gone.stderr
    assert _cli("stop", data).returncode == 0  # stopping twice is fine


def test_command_line_start_with_a_port_prints_a_tcp_url(new_data_dir) -> None:
    data = new_data_dir()
    port = _free_port()
    started = _cli("start", data, "--port", str(port))
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"postgresql://postgres@127.0.0.1:{port}/postgres"
    assert _cli("url", data).stdout.strip() == started.stdout.strip()
    with psycopg.connect(started.stdout.strip(), connect_timeout=5) as conn:  # libpq reads it too
        assert conn.execute("SELECT 1").fetchone() == (1,)
