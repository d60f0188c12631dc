"""The machine's load around each figure: load average and other processes' CPU.

A figure from a busy machine is not comparable with one from a quiet machine,
so every run records, before it starts, the 1-minute load average and the CPU
that processes *not* started by this benchmark used over a short sample, and
the same share again while the run lasted. "Ours" is this harness and its
descendants plus the PostgreSQL server it started (the postmaster's process
tree); everything else (other users' tests, builds, editors) is "others".

The load average counts our own previous figure too (it decays over minutes),
so the others' CPU share is the honest measure of outside noise; both are
printed beside every figure.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CORES = os.cpu_count() or 1


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, utime+stime jiffies, start time) for every process."""
    out: dict[int, tuple[int, int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = Path(f"/proc/{entry.name}/stat").read_text()
            rest = raw[raw.rindex(")") + 2 :].split()
            # rest[0] is field 3 (state): ppid=4, utime=14, stime=15, starttime=22
            out[int(entry.name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), rest[19])
    return out


def _ours(procs: dict[int, tuple[int, int, str]], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo += children.get(pid, [])
    return found


@dataclass
class Sampler:
    """Accumulates other processes' CPU between calls to sample()."""

    roots: set[int]
    others_jiffies: int = 0
    machine_jiffies: int = 0
    _procs: dict[int, tuple[int, int, str]] = field(default_factory=dict)
    _machine: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self._procs = _processes()
        self._machine = _machine_jiffies()

    def sample(self) -> None:
        procs = _processes()
        machine = _machine_jiffies()
        ours = _ours(procs, self.roots)
        for pid, (_, cpu, start) in procs.items():
            if pid in ours:
                continue
            before = self._procs.get(pid)
            # a process new since the last sample spent all its CPU in this interval
            self.others_jiffies += cpu - before[1] if before and before[2] == start else cpu
        self.machine_jiffies += machine[1] - self._machine[1]
        self._procs, self._machine = procs, machine

    def others_pct(self) -> float | None:
        """Other processes' CPU as a share of the machine (100 = every core busy)."""
        if self.machine_jiffies <= 0:
            return None
        return round(min(100.0, 100.0 * self.others_jiffies / self.machine_jiffies), 1)


def postmaster_pid(data_dir: Path | None) -> int | None:
    if data_dir is None:
        return None
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    return None


@dataclass
class Monitor:
    """Before a run: a short quiet sample; during it: a background sampler."""

    roots: set[int]
    before_s: float = 1.0
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _during: Sampler | None = None

    def before(self) -> dict[str, float | None]:
        load1 = os.getloadavg()[0]
        sampler = Sampler(self.roots)
        time.sleep(self.before_s)
        sampler.sample()
        return {"loadavg_1m": round(load1, 2), "others_cpu_pct": sampler.others_pct()}

    def start(self) -> None:
        self._during = Sampler(self.roots)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        assert self._during is not None
        while not self._stop.wait(0.5):
            self._during.sample()

    def finish(self) -> dict[str, float | None]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        assert self._during is not None
        self._during.sample()
        return {
            "loadavg_1m_after": round(os.getloadavg()[0], 2),
            "others_cpu_pct_during": self._during.others_pct(),
        }


def describe(load: dict[str, float | None]) -> str:
    """`load 0.42, others 3% (during 5%)` for the log line beside a figure."""
    text = f"load {load.get('loadavg_1m')}, others {load.get('others_cpu_pct')}%"
    if load.get("others_cpu_pct_during") is not None:
        text += f" (during {load['others_cpu_pct_during']}%)"
    if load.get("waited_s"):
        text += f", waited {load['waited_s']:.0f}s for quiet"
    return text
