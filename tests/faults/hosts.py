"""Hosts on a private network: Linux network namespaces on one virtual switch.

Each host is a namespace with one interface (`eth0`) whose other end is a
port of a bridge that lives in a namespace of its own (the switch), so no
address of this network is routed anywhere else: the machine's own
namespace gets no interface, no address and no route, and a host with its
link down can reach nobody (not even by a default route: there is none).

A partition is a host's switch port brought down (`cut`), healed by
bringing it up again (`heal`): packets in flight are dropped, not refused,
as on a real network, so connections hang until a timeout rather than
fail at once.

Needs root and `ip` (iproute2). `tear_down` kills every process still in
the run's namespaces and deletes them; it is safe to call twice, and
`Network` is a context manager that calls it on the way out, whatever
happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.77.0"  # Private to the run's switch: nothing outside it has a route here.
FIRST_ADDRESS = 10
NETNS_DIR = Path("/run/netns")
NETEM_PROBE = ("tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms")


class HostsUnavailable(RuntimeError):
    """The machine cannot make network namespaces (not root, or no iproute2)."""


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # What the run calls it: "db", "w1", "node1", ...
    namespace: str
    address: str  # Its address on the run's switch.
    port: str  # Its switch port (in the switch namespace).

    def command(self, *argv: str) -> list[str]:
        """argv run inside this host (same pid: `ip netns exec` execs, it does not fork)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def require() -> None:
    """Refuse clearly when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise HostsUnavailable("Hosts are network namespaces: run as root.")
    if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        raise HostsUnavailable("Hosts need `ip` from iproute2.")
    if not hasattr(os, "setns"):
        raise HostsUnavailable("Entering a host needs Python 3.12 or later (os.setns).")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


class Network:
    """A switch and the hosts plugged into it, named `<prefix>-<host>`."""

    def __init__(self, prefix: str | None = None) -> None:
        require()
        self.prefix = prefix or f"cv{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self.created: list[str] = []  # Namespaces, in creation order.
        self.home: int | None = None  # Our own namespace, once we entered a host's.
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.tear_down()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add(self, name: str) -> Host:
        """A new host on the switch, link up."""
        index = FIRST_ADDRESS + len(self.hosts)
        host = Host(name, f"{self.prefix}-{name}", f"{SUBNET}.{index}", f"p{index}")
        self._add_namespace(host.namespace)
        # Both ends are made inside namespaces: no interface ever exists in ours.
        _ip(
            "-n",
            self.switch,
            "link",
            "add",
            host.port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.namespace,
        )
        _ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Partition the host: its switch port goes down; in-flight packets are lost."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def enter(self, host: Host) -> None:
        """Move this process (and every process and thread it starts from now on) into host.

        Call it before starting threads: a thread keeps the namespace it was
        created in.
        """
        if self.home is None:
            self.home = os.open("/proc/self/ns/net", os.O_RDONLY)
        with open(NETNS_DIR / host.namespace) as ns:
            os.setns(ns.fileno(), os.CLONE_NEWNET)  # type: ignore[attr-defined]

    def leave(self) -> None:
        """Back to the namespace this process started in."""
        if self.home is not None:
            os.setns(self.home, os.CLONE_NEWNET)  # type: ignore[attr-defined]
            os.close(self.home)
            self.home = None

    def netem_error(self, host: Host) -> str | None:
        """None if `tc netem` works in host (the probe is removed again), else why not."""
        proc = subprocess.run(host.command(*NETEM_PROBE), capture_output=True, text=True)
        if proc.returncode != 0:
            return (proc.stderr or proc.stdout).strip() or f"tc exited {proc.returncode}"
        subprocess.run(host.command("tc", "qdisc", "del", "dev", "eth0", "root"), check=False)
        return None

    def tear_down(self) -> None:
        """Kill what still runs in the run's namespaces, then delete them (always safe)."""
        self.leave()
        for name in reversed(self.created):
            _kill_namespace_processes(name)
        for name in reversed(self.created):
            _ip("netns", "del", name, check=False)
        self.created.clear()


def _kill_namespace_processes(namespace: str) -> None:
    """SIGKILL every process in the namespace (ours: it was made for this run)."""
    for _ in range(50):
        proc = _ip("netns", "pids", namespace, check=False)
        pids = [int(p) for p in proc.stdout.split() if p.strip().isdigit()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    print(f"hosts: processes still in {namespace} after SIGKILL", file=sys.stderr)
