"""A real PostgreSQL HA cluster: pg_auto_failover's monitor, a primary and a standby.

Debian's `postgresql-15-auto-failover` (`pg_autoctl`), each node on a host
of its own (a network namespace, tests/faults/hosts.py), on its own port
(the nodes share the machine's socket folder, so they need distinct ports
even though their addresses differ). The standby is synchronous (the
default: `--replication-quorum true`, so the primary's
`synchronous_standby_names` names it) or, with `synchronous=False`,
asynchronous (`--replication-quorum false`: commits return before the
standby has them).

The monitor's health checks are tightened (TUNING) so a failover takes
seconds rather than the default half-minute; the keepers' network
partition timeout too (a primary that can reach neither the monitor nor
the standby demotes itself after it). The monitor's own promotion wait
stays longer than that timeout, as pg_auto_failover requires.

From a shell, one command brings a cluster up, runs a command on the
application host (with the connection settings in the environment) and
tears it all down, whatever happens:

    python tests/ha/cluster.py [--async] -- COMMAND ...

With no command it prints the settings and waits for Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.faults.hosts import Host, Network

BINDIR = Path("/usr/lib/postgresql/15/bin")
SOCKET_DIR = Path("/var/run/postgresql")
DATABASE = "conveyor"
USER = "postgres"
MONITOR_DATABASE = "pg_auto_failover"
START_TIMEOUT_SECONDS = 180.0
STOP_GRACE_SECONDS = 15.0
PARTITION_TIMEOUT_SECONDS = 3  # Keeper: demote itself after this long alone.
# The monitor (milliseconds): check every second, one retry, call a node
# unhealthy after 3 s without a report, wait 6 s (> the keepers' partition
# timeout) for a lost primary to demote itself before promoting the standby.
TUNING = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    "pgautofailover.primary_demote_timeout": 6000,
}
NODES = """
SELECT nodename, nodehost, nodeport, reportedstate, goalstate, health, reportedlsn::text
FROM pgautofailover.node ORDER BY nodeid
"""
EVENTS = """
SELECT eventtime, nodename, reportedstate, goalstate, description
FROM pgautofailover.event ORDER BY eventid
"""
PRIMARY_STATES = ("single", "wait_primary", "primary")


class ClusterError(RuntimeError):
    """The cluster did not reach the state it was asked for."""


@dataclass(slots=True)
class Node:
    name: str
    host: Host
    port: int
    home: Path  # pgdata, pg_autoctl's configuration and state, the keeper's log.
    keeper: subprocess.Popen[bytes] | None = None
    runs: int = 0

    @property
    def pgdata(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "pg_autoctl.log"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def local(self, dbname: str = DATABASE) -> psycopg.Connection:
        """A connection over the machine's Unix socket: not through the (partitionable) network."""
        return psycopg.connect(
            host=str(SOCKET_DIR),
            port=self.port,
            user=USER,
            dbname=dbname,
            autocommit=True,
            connect_timeout=3,
        )


@dataclass(slots=True)
class Cluster:
    """Monitor, node1 (first primary) and node2, each on a host of `network`."""

    network: Network
    work: Path
    synchronous: bool = True
    monitor: Node = field(init=False)
    nodes: list[Node] = field(init=False)

    def __post_init__(self) -> None:
        user = pwd.getpwnam(USER)
        self.work.mkdir(parents=True, exist_ok=True)
        os.chown(self.work, user.pw_uid, user.pw_gid)
        ports = _free_ports(3)
        names = ("monitor", "node1", "node2")
        made = []
        for name, port in zip(names, ports, strict=True):
            home = self.work / name
            home.mkdir()
            os.chown(home, user.pw_uid, user.pw_gid)
            made.append(Node(name, self.network.add(name), port, home))
        self.monitor, *self.nodes = made

    # -- bringing it up ------------------------------------------------------

    def start(self) -> Cluster:
        monitor = self.monitor
        self._autoctl(
            monitor,
            "create",
            "monitor",
            "--pgdata",
            str(monitor.pgdata),
            "--pgport",
            str(monitor.port),
            "--hostname",
            monitor.host.address,
            "--auth",
            "trust",
            "--no-ssl",
            "--pgctl",
            str(BINDIR / "pg_ctl"),
        )
        self._run(monitor)
        _wait(lambda: _can_connect(monitor, MONITOR_DATABASE), "the monitor to accept connections")
        with monitor.local(MONITOR_DATABASE) as conn:
            for name, value in TUNING.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {int(value)}")
            conn.execute("SELECT pg_reload_conf()")
        first, second = self.nodes
        self._create_node(first)
        _wait(lambda: self._state(first) in PRIMARY_STATES, f"{first.name} to become primary")
        self._create_node(second, quorum=self.synchronous)

        def ready() -> bool:
            states = self.states()
            if states.get(second.name) == "catchingup":
                # pg_basebackup waits for a spread checkpoint: make it immediate.
                with contextlib.suppress(psycopg.Error), first.local() as conn:
                    conn.execute("CHECKPOINT")
            return states == {first.name: "primary", second.name: "secondary"}

        _wait(ready, "the standby to catch up", poll=1.0)
        return self

    def _create_node(self, node: Node, *, quorum: bool = True) -> None:
        monitor_uri = (
            f"postgres://autoctl_node@{self.monitor.host.address}:{self.monitor.port}"
            f"/{MONITOR_DATABASE}?sslmode=disable"
        )
        self._autoctl(
            node,
            "create",
            "postgres",
            "--pgdata",
            str(node.pgdata),
            "--pgport",
            str(node.port),
            "--hostname",
            node.host.address,
            "--name",
            node.name,
            "--dbname",
            DATABASE,
            "--auth",
            "trust",
            "--no-ssl",
            "--pg-hba-lan",
            "--pgctl",
            str(BINDIR / "pg_ctl"),
            "--monitor",
            monitor_uri,
            "--replication-quorum",
            "true" if quorum else "false",
        )
        self._autoctl(
            node,
            "config",
            "set",
            "--pgdata",
            str(node.pgdata),
            "timeout.network_partition_timeout",
            str(PARTITION_TIMEOUT_SECONDS),
        )
        self._run(node)

    def _env(self, node: Node) -> dict[str, str]:
        return {
            "PATH": f"{BINDIR}:/usr/bin:/bin",
            "HOME": str(node.home),
            "XDG_CONFIG_HOME": str(node.home / "config"),
            "XDG_DATA_HOME": str(node.home / "share"),
            "XDG_RUNTIME_DIR": str(node.home / "run"),
            "PG_CONFIG": str(BINDIR / "pg_config"),
            "LANG": "C.UTF-8",
        }

    def _argv(self, node: Node, *args: str) -> list[str]:
        # setpriv execs (as does `ip netns exec`): the pid we get is pg_autoctl's.
        return node.host.command(
            "setpriv",
            f"--reuid={USER}",
            f"--regid={USER}",
            "--clear-groups",
            "pg_autoctl",
            *args,
        )

    def _autoctl(self, node: Node, *args: str) -> None:
        with open(node.log, "ab") as log:
            proc = subprocess.run(
                self._argv(node, *args),
                cwd=node.home,
                env=self._env(node),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_SECONDS,
            )
        if proc.returncode != 0:
            tail = node.log.read_text(errors="replace")[-3000:]
            raise ClusterError(f"pg_autoctl {' '.join(args[:2])} on {node.name} failed:\n{tail}")

    def _run(self, node: Node) -> None:
        """Start the node's keeper (`pg_autoctl run`), which runs and supervises its postgres."""
        with open(node.log, "ab") as log:
            node.keeper = subprocess.Popen(
                self._argv(node, "run", "--pgdata", str(node.pgdata)),
                cwd=node.home,
                env=self._env(node),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.runs += 1

    # -- what the monitor says -----------------------------------------------

    def nodes_table(self) -> list[dict[str, Any]]:
        with self.monitor.local(MONITOR_DATABASE) as conn, conn.cursor() as cur:
            cur.execute(NODES)
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def states(self) -> dict[str, str]:
        """Each node's reported state, when the monitor's goal for it is the same (settled)."""
        try:
            table = self.nodes_table()
        except psycopg.Error:
            return {}
        return {
            r["nodename"]: r["reportedstate"] for r in table if r["reportedstate"] == r["goalstate"]
        }

    def _state(self, node: Node) -> str | None:
        return self.states().get(node.name)

    def primary(self) -> Node | None:
        """The node the monitor has settled as primary, if any."""
        states = self.states()
        return next((n for n in self.nodes if states.get(n.name) in PRIMARY_STATES), None)

    def events(self) -> list[dict[str, Any]]:
        with self.monitor.local(MONITOR_DATABASE) as conn, conn.cursor() as cur:
            cur.execute(EVENTS)
            names = [c.name for c in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    # -- what the application sees -------------------------------------------

    @property
    def hosts(self) -> str:
        return ",".join(n.host.address for n in self.nodes)

    @property
    def ports(self) -> str:
        return ",".join(str(n.port) for n in self.nodes)

    def conninfo(self, **extra: str | int) -> str:
        """libpq settings naming every node; only a read-write one is accepted."""
        params: dict[str, str | int] = {
            "host": self.hosts,
            "port": self.ports,
            "dbname": DATABASE,
            "user": USER,
            "target_session_attrs": "read-write",
            "connect_timeout": 3,
            **extra,
        }
        return " ".join(f"{k}={v}" for k, v in params.items())

    def url(self) -> str:
        pairs = ",".join(f"{n.host.address}:{n.port}" for n in self.nodes)
        return f"postgresql://{USER}@{pairs}/{DATABASE}?target_session_attrs=read-write"

    # -- faults --------------------------------------------------------------

    def crash(self, node: Node) -> float:
        """The host dies: SIGKILL its keeper, postmaster and every server process; returns when.

        All of them, not the postmaster alone: a backend or WAL sender outlives its
        postmaster for a moment (and a stopped one until it is continued), which a
        crashed machine does not allow.
        """
        postmaster = node.postmaster_pid()
        pids = [postmaster, *_children(postmaster)] if postmaster else []
        if node.keeper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.keeper.pid, signal.SIGKILL)
        for pid in pids:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        at = time.time()  # From here on, nothing commits on this node.
        if node.keeper is not None:
            node.keeper.wait(10)
        _wait(lambda: not _postmaster_alive(node), f"{node.name}'s postmaster to die")
        return at

    def restart(self, node: Node) -> None:
        """The host is back: its keeper starts again and rejoins (as a standby, now)."""
        self._run(node)

    def cut(self, node: Node) -> float:
        """Cut the node's host off; the time from which no packet passes."""
        self.network.cut(node.host)
        return time.time()

    def heal(self, node: Node) -> None:
        self.network.heal(node.host)

    # -- tearing it down -----------------------------------------------------

    def stop(self) -> None:
        """SIGTERM every keeper (each stops its postgres), SIGKILL what remains."""
        everyone = [*self.nodes, self.monitor]
        for node in everyone:
            if node.keeper is not None and node.keeper.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.keeper.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for node in everyone:
            if node.keeper is None:
                continue
            try:
                node.keeper.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.keeper.pid, signal.SIGKILL)
                node.keeper.wait(10)
            if (pid := node.postmaster_pid()) and _postmaster_alive(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    """The processes whose parent is pid (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command may hold spaces and parentheses: the parent id follows the last ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _postmaster_alive(node: Node) -> bool:
    pid = node.postmaster_pid()
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"/usr/lib/postgresql")


def _can_connect(node: Node, dbname: str) -> bool:
    try:
        with node.local(dbname):
            return True
    except psycopg.Error:
        return False


def _wait(
    done: Any, what: str, *, timeout: float = START_TIMEOUT_SECONDS, poll: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise ClusterError(f"Timed out after {timeout:.0f}s waiting for {what}.")
        time.sleep(poll)


def _free_ports(count: int) -> list[int]:
    """Ports whose socket lock no live server holds (the nodes share the socket folder)."""
    chosen: list[int] = []
    rng = random.SystemRandom()
    while len(chosen) < count:
        port = rng.randrange(20000, 60000)
        lock = SOCKET_DIR / f".s.PGSQL.{port}.lock"
        if port not in chosen and not lock.exists():
            chosen.append(port)
    return chosen


@contextlib.contextmanager
def running_cluster(*, synchronous: bool = True, keep: Path | None = None) -> Any:
    """A started cluster on a new network, with the caller moved onto its `app` host.

    Everything is torn down on the way out (keepers, servers, namespaces,
    files), also on errors; `keep` copies the nodes' logs out first.
    """
    work = Path(tempfile.mkdtemp(prefix="conveyor-ha-"))
    work.chmod(0o755)
    with Network() as network:
        cluster = Cluster(network, work / "nodes", synchronous=synchronous)
        app = network.add("app")
        try:
            network.enter(app)
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                for node in [cluster.monitor, *cluster.nodes]:
                    shutil.copy(node.log, keep / f"{node.name}-pg_autoctl.log")
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bring up a pg_auto_failover cluster.")
    parser.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="An asynchronous standby (default: synchronous).",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to run on 'app'.")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with running_cluster(synchronous=not args.asynchronous) as cluster:
        env = {
            **os.environ,
            "CONVEYOR_HA_CONNINFO": cluster.conninfo(),
            "CONVEYOR_HA_URL": cluster.url(),
            "CONVEYOR_HA_HOSTS": cluster.hosts,
            "CONVEYOR_HA_PORTS": cluster.ports,
        }
        for key in ("CONVEYOR_HA_CONNINFO", "CONVEYOR_HA_URL"):
            print(f"{key}={env[key]}", flush=True)
        if not command:
            print("Cluster up; Ctrl-C tears it down.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
            return 0
        return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
