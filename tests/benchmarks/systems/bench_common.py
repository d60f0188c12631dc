"""Shared by every system adapter; runs inside the system's own virtualenv.

Protocol: ``python <system>_adapter.py <command> '<json params>'``. The adapter
prints exactly one line starting with ``BENCH-RESULT `` followed by a JSON
object; anything else on stdout/stderr is log noise for the parent's log file.

Handlers record themselves: each handler appends ``seq start end`` (wall-clock
seconds) to a per-process file in ``$BENCH_MARKS_DIR``. Drain throughput is
taken from those marks (first start to last end), latency from handler start
minus the producer's enqueue-commit time. Completion in the system's own
tables is counted afterwards to check nothing was lost.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

RESULT_PREFIX = "BENCH-RESULT "
SYSTEMS_DIR = Path(__file__).resolve().parent

# ---------------------------------------------------------------- handler side

_fd: int | None = None
_fd_pid: int | None = None


def _marks_fd() -> int:
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:  # re-open after fork (prefork pools)
        folder = os.environ["BENCH_MARKS_DIR"]
        _fd = os.open(
            os.path.join(folder, f"marks-{pid}.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
        )
        _fd_pid = pid
    return _fd


def record(seq: int, started: float) -> None:
    """Append one mark; a single O_APPEND write is atomic across threads."""
    os.write(_marks_fd(), f"{seq} {started:.6f} {time.time():.6f}\n".encode())


def hash_work(rounds: int = 1000) -> bytes:
    digest = b"conveyor-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest


def noop_job(seq: int) -> None:
    record(seq, time.time())


def relay_job(seq: int) -> None:
    started = time.time()
    time.sleep(0.010)
    hash_work()
    record(seq, started)


async def noop_job_async(seq: int) -> None:
    record(seq, time.time())


async def relay_job_async(seq: int) -> None:
    import asyncio

    started = time.time()
    await asyncio.sleep(0.010)
    hash_work()
    record(seq, started)


# ---------------------------------------------------------------- marks


@dataclass
class MarkReader:
    folder: Path
    offsets: dict[str, int] = field(default_factory=dict)
    marks: dict[int, tuple[float, float]] = field(default_factory=dict)
    duplicates: int = 0

    def poll(self) -> int:
        for path in sorted(self.folder.glob("marks-*.txt")):
            start = self.offsets.get(path.name, 0)
            with path.open("rb") as fh:
                fh.seek(start)
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            self.offsets[path.name] = start + cut
            for line in data[:cut].splitlines():
                seq_s, t0, t1 = line.split()
                seq = int(seq_s)
                if seq in self.marks:
                    self.duplicates += 1
                else:
                    self.marks[seq] = (float(t0), float(t1))
        return len(self.marks)

    def count(self, seqs_from: int = 0) -> int:
        self.poll()
        return sum(1 for s in self.marks if s >= seqs_from)


# ---------------------------------------------------------------- processes


_spawned: list[subprocess.Popen[bytes]] = []


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a worker in its own process group, noted for the parent's clean-up."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    _spawned.append(proc)
    pgid_file = os.environ.get("BENCH_PGID_FILE")
    if pgid_file:
        with open(pgid_file, "a") as fh:
            fh.write(f"{proc.pid}\n")
    return proc


def _on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def stop(procs: Sequence[subprocess.Popen[bytes]], grace: float = 30.0) -> None:
    """SIGTERM each worker's process group, then SIGKILL whatever is left."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for proc in procs:  # grandchildren left in the group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def children_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def wait_for(
    reader: MarkReader,
    n: int,
    procs: Sequence[subprocess.Popen[bytes]],
    timeout: float,
    seqs_from: int = 0,
    exit_ok: bool = False,
) -> bool:
    """Poll marks until n jobs ran; False on timeout or all workers exited early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reader.count(seqs_from) >= n:
            return True
        if procs and all(p.poll() is not None for p in procs):
            return reader.count(seqs_from) >= n or exit_ok
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- adapters


class Adapter(Protocol):
    name: str

    def install(self) -> dict[str, Any]: ...

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None: ...

    def enqueue_one(self, kind: str, seq: int) -> None: ...

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]: ...

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]: ...

    def count_finished(self) -> int | None: ...

    def insert_finished(self, n: int) -> None: ...

    def close(self) -> None: ...


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Run:
    adapter: Adapter
    params: dict[str, Any]
    workdir: Path

    def __post_init__(self) -> None:
        self.marks_dir = self.workdir / "marks"
        self.marks_dir.mkdir(parents=True, exist_ok=True)
        os.environ["BENCH_MARKS_DIR"] = str(self.marks_dir)
        self.log = self.workdir / "worker.log"
        self.reader = MarkReader(self.marks_dir)

    def start_workers(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[subprocess.Popen[bytes]]:
        argvs = self.adapter.worker_argvs(kind, processes, concurrency, burst)
        return [spawn(argv, self.log) for argv in argvs]

    def drain_batch(
        self, kind: str, n: int, processes: int, concurrency: int, timeout: float
    ) -> dict[str, Any]:
        started = time.time()
        procs = self.start_workers(kind, processes, concurrency, burst=True)
        ok = wait_for(self.reader, n, procs, timeout)
        if getattr(self.adapter, "has_burst", False):
            # burst workers exit by themselves once the queue is empty
            deadline = time.monotonic() + 20
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        exited = time.time()
        stop(procs)
        self.reader.poll()
        handled = [m for s, m in self.reader.marks.items() if s >= 0]
        if not handled:
            raise RuntimeError(f"no job ran; see {self.log.name}: {tail(self.log)}")
        first = min(m[0] for m in handled)
        last = max(m[1] for m in handled)
        finished = self.adapter.count_finished()
        return {
            "completed_in_time": ok,
            "handled": len(handled),
            "duplicates": self.reader.duplicates,
            "finished_rows": finished,
            "jobs_per_s": len(handled) / max(last - first, 1e-6),
            "handler_window_s": last - first,
            "wall_s_incl_startup_exit": exited - started,
            "worker_peak_rss_mb": children_peak_rss_mb(),
        }


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def workload_drain(run: Run) -> dict[str, Any]:
    p = run.params
    n, single_n = int(p["jobs"]), int(p["single_jobs"])
    kind = p.get("kind", "noop")
    a = run.adapter
    single_s = timed(lambda: [a.enqueue_one(kind, s) for s in range(single_n)])
    bulk_seqs = list(range(single_n, n))
    bulk_s = timed(lambda: a.enqueue_bulk(kind, bulk_seqs))
    out = run.drain_batch(
        kind, n, int(p["processes"]), int(p["concurrency"]), float(p.get("timeout", 600))
    )
    out.update(
        {
            "enqueue_one_per_call_per_s": single_n / single_s if single_n else None,
            "enqueue_bulk_per_s": len(bulk_seqs) / bulk_s if bulk_seqs else None,
            "knobs": a.knobs(kind, int(p["processes"]), int(p["concurrency"])),
        }
    )
    return out


def workload_growth(run: Run) -> dict[str, Any]:
    history = int(run.params["history"])
    t = timed(lambda: run.adapter.insert_finished(history))
    out = workload_drain(run)
    if out.get("finished_rows") is not None:
        out["finished_rows"] -= history
    out["history_rows"] = history
    out["history_insert_s"] = t
    return out


def workload_latency(run: Run) -> dict[str, Any]:
    p = run.params
    n, rate = int(p["jobs"]), float(p["rate"])
    processes, concurrency = int(p["processes"]), int(p["concurrency"])
    a = run.adapter
    procs = run.start_workers("noop", processes, concurrency, burst=False)
    try:
        # warm-up: proves the worker is up and listening, then let it go idle
        warm = list(range(-5, 0))
        for s in warm:
            a.enqueue_one("noop", s)
        if not wait_for(run.reader, 5, procs, 120, seqs_from=-5):
            raise RuntimeError(f"worker never picked up warm-up jobs: {tail(run.log)}")
        time.sleep(float(p.get("idle_s", 2.0)))
        committed: dict[int, float] = {}
        t0 = time.perf_counter()
        for seq in range(n):
            delay = t0 + seq / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            a.enqueue_one("noop", seq)
            committed[seq] = time.time()
        produce_s = time.perf_counter() - t0
        ok = wait_for(run.reader, n + 5, procs, 60, seqs_from=-5)
    finally:
        stop(procs)
    run.reader.poll()
    lat = [
        (run.reader.marks[s][0] - c) * 1000.0 for s, c in committed.items() if s in run.reader.marks
    ]
    if not lat:
        raise RuntimeError(f"no latency sample; worker log: {tail(run.log)}")
    return {
        "completed_in_time": ok,
        "samples": len(lat),
        "achieved_rate": n / produce_s,
        "p50_ms": percentile(lat, 0.50),
        "p95_ms": percentile(lat, 0.95),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat),
        "mean_ms": statistics.fmean(lat),
        "worker_peak_rss_mb": children_peak_rss_mb(),
        "knobs": a.knobs("noop", processes, concurrency),
    }


def tree_pids(pid: int) -> list[int]:
    """pid and its descendants, from /proc/<pid>/task/*/children."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                todo += [int(x) for x in (task / "children").read_text().split()]
    return found


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def workload_soak(run: Run) -> dict[str, Any]:
    """Drain many jobs with one worker process, sampling its RSS as it goes."""
    p = run.params
    n, processes, concurrency = int(p["jobs"]), int(p["processes"]), int(p["concurrency"])
    a = run.adapter
    a.enqueue_bulk("noop", list(range(n)))
    procs = run.start_workers("noop", processes, concurrency, burst=True)
    samples: list[tuple[int, float]] = []
    deadline = time.monotonic() + float(p.get("timeout", 1800))
    try:
        while time.monotonic() < deadline:
            done = run.reader.count()
            rss = max((rss_mb(pid) for proc in procs for pid in tree_pids(proc.pid)), default=0.0)
            if rss:
                samples.append((done, round(rss, 2)))
            if done >= n or all(proc.poll() is not None for proc in procs):
                break
            time.sleep(0.1)
    finally:
        stop(procs)
    run.reader.poll()
    if len(samples) < 2:
        raise RuntimeError(f"too few RSS samples ({len(samples)}): {tail(run.log)}")
    early = next((r for d, r in samples if d >= n // 10), samples[0][1])
    late = samples[-1][1]
    marks = [m for s, m in run.reader.marks.items() if s >= 0]
    window = max(m[1] for m in marks) - min(m[0] for m in marks)
    return {
        "handled": len(marks),
        "jobs_per_s": len(marks) / max(window, 1e-6),
        "rss_mb_at_10pct": early,
        "rss_mb_at_end": late,
        "rss_growth_mb": round(late - early, 2),
        "worker_peak_rss_mb": children_peak_rss_mb(),
        "rss_samples": samples[:: max(1, len(samples) // 50)],
        "knobs": a.knobs("noop", processes, concurrency),
    }


WORKLOADS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "drain": workload_drain,
    "relay": workload_drain,  # same shape, params carry kind="relay"
    "growth": workload_growth,
    "latency": workload_latency,
    "soak": workload_soak,
}


def main(make_adapter: Callable[[dict[str, Any]], Adapter]) -> None:
    """Entry point for every adapter script."""
    command = sys.argv[1]
    params: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    result: dict[str, Any]
    adapter: Adapter | None = None
    if command != "worker":  # in-process workers keep their own signal handling
        signal.signal(signal.SIGTERM, _on_signal)
    try:
        adapter = make_adapter(params)
        if command == "install":
            result = adapter.install()
        elif command == "worker":
            adapter.work(params)  # type: ignore[attr-defined]
            result = {}
        elif command in WORKLOADS:
            run = Run(adapter, params, Path(params["workdir"]))
            result = WORKLOADS[command](run)
        else:
            raise SystemExit(f"unknown command {command!r}")
        result["ok"] = True
    except Exception as exc:  # reported to the parent, which carries on
        import traceback

        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        stop(_spawned, grace=10)
        if adapter is not None:
            with contextlib.suppress(Exception):
                adapter.close()
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
