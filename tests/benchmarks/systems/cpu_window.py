"""CPU time of a worker and of PostgreSQL over a window of a drain, from /proc.

The profile workload uses it to say whether a drain is bound by CPU or by
the worker and the server waiting on each other: the worker's CPU per job,
its database backends' CPU per job, the server's other processes, and how
much of the machine stayed idle. It reads /proc (Linux) for the worker's
process and for the backends of the drain's database, so it needs the
server on this machine (the embedded one); elsewhere the server's share is
left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def process_seconds(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process, all its threads; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def machine_seconds() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot, all cores."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS, idle / TICKS


@dataclass
class Snapshot:
    processes: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    machine: tuple[float, float] = (0.0, 0.0)
    commits: int = 0


def server_pids(sql: Any) -> dict[str, list[int]]:
    """The drain database's client backends, and the server's other processes."""
    rows = sql(
        "SELECT pid, backend_type = 'client backend' AND datname = current_database() "
        "FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
    )
    return {
        "backends": [int(pid) for pid, ours in rows if ours],
        "server_other": [int(pid) for pid, ours in rows if not ours],
    }


def snapshot(sql: Any, worker_pid: int) -> Snapshot:
    groups = {"worker": [worker_pid], **server_pids(sql)}
    snap = Snapshot(machine=machine_seconds())
    for name, pids in groups.items():
        found = {pid: cpu for pid in pids if (cpu := process_seconds(pid)) is not None}
        snap.processes[name] = found
    snap.commits = int(
        sql("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")[0][0]
    )
    return snap


def per_job(before: Snapshot, after: Snapshot, jobs: int, seconds: float) -> dict[str, Any]:
    """CPU µs per job of each group (processes seen at both ends), and the machine's idle share."""
    jobs = max(jobs, 1)
    out: dict[str, Any] = {"jobs": jobs, "seconds": seconds}
    for name, start in before.processes.items():
        end = after.processes.get(name, {})
        user = sum(end[p][0] - start[p][0] for p in start if p in end)
        system = sum(end[p][1] - start[p][1] for p in start if p in end)
        out[name] = {
            "user_us_per_job": 1e6 * user / jobs,
            "system_us_per_job": 1e6 * system / jobs,
            "cpu_us_per_job": 1e6 * (user + system) / jobs,
            "share_of_one_core": (user + system) / seconds if seconds else None,
        }
    busy = after.machine[0] - before.machine[0]
    idle = after.machine[1] - before.machine[1]
    out["machine_idle_share"] = idle / (busy + idle) if busy + idle else None
    out["machine_busy_us_per_job"] = 1e6 * busy / jobs
    # Commits of the drain's database (the worker's cycles and services, and the
    # harness's own count queries, which are a few per second).
    out["commits_per_1000_jobs"] = 1000 * (after.commits - before.commits) / jobs
    return out
