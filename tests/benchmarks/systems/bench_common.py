"""Shared by every system adapter; runs inside the system's own virtualenv.

Protocol: ``python <system>_adapter.py <command> '<json params>'``. The adapter
prints exactly one line starting with ``BENCH-RESULT `` followed by a JSON
object; anything else on stdout/stderr is log noise for the parent's log file.

Handlers record themselves: each handler appends ``seq start end`` (wall-clock
seconds) to a per-process file in ``$BENCH_MARKS_DIR``. A drain's window runs
from the first handler start to the moment the *system's own store* shows
every job acknowledged (polled from a separate connection), never to the
moment a worker says it is done. Latency is taken from the handler's start
minus the moment the producer *began* its enqueue call.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
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
ACK_POLL_S = 0.005  # how often the store is polled once the last jobs are running
MARK_POLL_S = 0.02
EXITED_GRACE_S = 5.0  # how long the store may lag once every worker has exited

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
    real: int = 0  # marks of seq >= 0 (negative seqs are warm-up jobs)

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
                    self.real += seq >= 0
        return len(self.marks)

    def count(self, seqs_from: int = 0) -> int:
        """Jobs that ran with seq >= seqs_from (0: every real job)."""
        self.poll()
        if seqs_from == 0:
            return self.real
        return sum(1 for s in self.marks if s >= seqs_from)

    def handled(self) -> list[tuple[float, float]]:
        self.poll()
        return [m for s, m in self.marks.items() if s >= 0]


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


def worker_rss(procs: Sequence[subprocess.Popen[bytes]]) -> tuple[float, float]:
    """(largest process, sum over processes) RSS in MB of every worker tree."""
    sizes = [rss_mb(pid) for proc in procs for pid in tree_pids(proc.pid)]
    sizes = [s for s in sizes if s > 0]
    return (max(sizes, default=0.0), sum(sizes))


# ---------------------------------------------------------------- adapters


class Adapter(Protocol):
    name: str
    has_burst: bool
    main_table: str | None

    def install(self) -> dict[str, Any]: ...

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None: ...

    def enqueue_one(self, kind: str, seq: int) -> None: ...

    def floor_setup(self) -> None: ...

    def floor_insert(self, i: int) -> None: ...

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]: ...

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]: ...

    def pending(self) -> int: ...

    def count_finished(self) -> int | None: ...

    def analyze(self) -> None: ...

    def table_stats(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


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
        self.setting: dict[str, Any] = dict(self.params.get("setting") or {})
        self.processes = int(self.params.get("processes", 1))
        self.kind = str(self.params.get("kind", "noop"))

    def start_workers(
        self,
        burst: bool,
        processes: int | None = None,
        setting: dict[str, Any] | None = None,
        kind: str | None = None,
    ) -> list[subprocess.Popen[bytes]]:
        argvs = self.adapter.worker_argvs(
            kind or self.kind,
            processes or self.processes,
            self.setting if setting is None else setting,
            burst,
        )
        return [spawn(argv, self.log) for argv in argvs]

    def knobs(self) -> dict[str, Any]:
        return self.adapter.knobs(self.kind, self.processes, self.setting)

    def load(self, n: int, seq_from: int = 0, kind: str | None = None) -> float:
        """Bulk-enqueue n jobs (seqs seq_from..) in the run's chunk size; returns jobs/s."""
        chunk = int(self.params.get("bulk_chunk", 5000))
        seqs = list(range(seq_from, seq_from + n))
        took = timed(
            lambda: [
                self.adapter.enqueue_bulk(kind or self.kind, seqs[i : i + chunk])
                for i in range(0, n, chunk)
            ]
        )
        return n / took if took > 0 else float("nan")

    def drain(
        self,
        n: int,
        procs: list[subprocess.Popen[bytes]],
        timeout: float,
        acknowledged: Callable[[], bool] | None = None,
        started: float | None = None,
        first_n: bool = False,
        burst: bool = True,
    ) -> dict[str, Any]:
        """Wait until n jobs ran and the store shows them acknowledged; the figure.

        The marks are watched until 99% of the jobs ran; from then on the store
        is polled every ACK_POLL_S, and the window ends at the start of the
        first poll that shows every job acknowledged (its snapshot is taken
        then), or at the last handler's end if that is later.
        """
        acknowledged = acknowledged or (lambda: self.adapter.pending() <= 0)
        started = time.time() if started is None else started
        deadline = time.monotonic() + timeout
        ok, acked_at, polls = False, None, 0
        gone_since: float | None = None
        while time.monotonic() < deadline:
            done = self.reader.count()
            exited = procs and all(p.poll() is not None for p in procs)
            if done >= n * 0.99 or exited:
                t_query = time.time()
                polls += 1
                if acknowledged():
                    ok, acked_at = True, t_query
                    break
                if exited:
                    # every worker is gone and the store still shows jobs unacknowledged
                    # (e.g. leases a worker gave up while the jobs stayed running): report it
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > EXITED_GRACE_S:
                        break
                time.sleep(ACK_POLL_S)
            else:
                time.sleep(MARK_POLL_S)
        if burst and self.adapter.has_burst and ok:
            # burst workers exit by themselves once the queue is empty
            end = time.monotonic() + 20
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, end - time.monotonic()))
        exited_at = time.time()
        stop(procs)
        handled = self.reader.handled()
        if not handled:
            raise RuntimeError(f"no job ran; see {self.log.name}: {tail(self.log)}")
        first = min(m[0] for m in handled)
        last = max(m[1] for m in handled)
        end = max(acked_at, last) if acked_at is not None else last
        counted = len(handled)
        if first_n and acked_at is not None:
            end, counted = acked_at, n
        return {
            "completed_in_time": ok,
            "handled": len(handled),
            "duplicates": self.reader.duplicates,
            "jobs_per_s": counted / max(end - first, 1e-6),
            "window_s": end - first,
            "window_end": "store shows every job acknowledged" if ok else "last handler end",
            "unacknowledged_at_end": None if ok else self.adapter.pending(),
            "ack_lag_ms": (acked_at - last) * 1000.0
            if acked_at is not None and not first_n
            else None,
            "ack_polls": polls,
            "jobs_per_s_by_handler_marks": len(handled) / max(last - first, 1e-6),
            "wall_s_incl_startup_exit": exited_at - started,
            "worker_peak_rss_mb": children_peak_rss_mb(),
        }


# ---------------------------------------------------------------- workloads


def workload_enqueue(run: Run) -> dict[str, Any]:
    """One call per transaction beside a bare INSERT on the same connection; bulk."""
    p = run.params
    n, bulk_n = int(p["single"]), int(p["bulk"])
    a = run.adapter
    a.floor_setup()
    for warm in range(-20, 0):  # connection, prepared statements, imports
        a.enqueue_one("noop", warm)
        a.floor_insert(warm)
    calls: list[float] = []
    floors: list[float] = []
    blocks = 4  # interleaved, so drift in the machine's load hits both alike
    per = max(1, n // blocks)
    seq = 0
    for _ in range(blocks):
        for _ in range(per):
            t0 = time.perf_counter()
            a.enqueue_one("noop", seq)
            calls.append(time.perf_counter() - t0)
            seq += 1
        for i in range(per):
            t0 = time.perf_counter()
            a.floor_insert(i)
            floors.append(time.perf_counter() - t0)
    bulk_rate = run.load(bulk_n, seq_from=10_000_000)
    one = len(calls) / sum(calls)
    floor = len(floors) / sum(floors)
    return {
        "enqueue_one_per_call_per_s": one,
        "floor_insert_commit_per_s": floor,
        "one_per_call_share_of_floor": one / floor,
        "enqueue_one_p50_us": percentile(calls, 0.5) * 1e6,
        "enqueue_one_p99_us": percentile(calls, 0.99) * 1e6,
        "floor_p50_us": percentile(floors, 0.5) * 1e6,
        "enqueue_bulk_per_s": bulk_rate,
        "single_calls": len(calls),
        "bulk_jobs": bulk_n,
        "bulk_chunk": int(p.get("bulk_chunk", 5000)),
        "knobs": {
            "one_per_call": "the system's own enqueue call, outside any transaction",
            "floor": a.floor_description,  # type: ignore[attr-defined]
            "bulk": a.bulk_description,  # type: ignore[attr-defined]
        },
    }


def workload_drain(run: Run) -> dict[str, Any]:
    n = int(run.params["jobs"])
    bulk_rate = run.load(n)
    run.adapter.analyze()
    started = time.time()
    procs = run.start_workers(burst=True)
    out = run.drain(n, procs, float(run.params.get("timeout", 1200)), started=started)
    out.update(
        {
            "enqueue_bulk_per_s": bulk_rate,
            "finished_rows": run.adapter.count_finished(),
            "knobs": run.knobs(),
        }
    )
    return out


def workload_latency(run: Run) -> dict[str, Any]:
    p = run.params
    n, rate = int(p["jobs"]), float(p["rate"])
    a = run.adapter
    procs = run.start_workers(burst=False)
    try:
        # warm-up: proves the worker is up and listening, then let it go idle
        for s in range(-5, 0):
            a.enqueue_one("noop", s)
        deadline = time.monotonic() + 120
        while run.reader.count(-5) < 5:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker never picked up warm-up jobs: {tail(run.log)}")
            time.sleep(0.05)
        time.sleep(float(p.get("idle_s", 2.0)))
        began: dict[int, float] = {}
        returned: dict[int, float] = {}
        t0 = time.perf_counter()
        for seq in range(n):
            delay = t0 + seq / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            began[seq] = time.time()
            a.enqueue_one("noop", seq)
            returned[seq] = time.time()
        produce_s = time.perf_counter() - t0
        deadline = time.monotonic() + 60
        while run.reader.count() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        ok = run.reader.count() >= n
    finally:
        stop(procs)
    run.reader.poll()
    marks = run.reader.marks
    lat = [(marks[s][0] - t) * 1000.0 for s, t in began.items() if s in marks]
    lat_ret = [(marks[s][0] - t) * 1000.0 for s, t in returned.items() if s in marks]
    if not lat:
        raise RuntimeError(f"no latency sample; worker log: {tail(run.log)}")
    return {
        "completed_in_time": ok,
        "samples": len(lat),
        "achieved_rate": n / produce_s,
        "measured_from": "start of the enqueue call",
        "p50_ms": percentile(lat, 0.50),
        "p95_ms": percentile(lat, 0.95),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat),
        "mean_ms": statistics.fmean(lat),
        "from_return_p50_ms": percentile(lat_ret, 0.50),
        "from_return_p99_ms": percentile(lat_ret, 0.99),
        "started_before_enqueue_returned": sum(1 for v in lat_ret if v < 0),
        "worker_peak_rss_mb": children_peak_rss_mb(),
        "knobs": run.knobs(),
    }


def deciles(ends: list[float], first_start: float, n: int) -> dict[str, float]:
    """Throughput of the first and last 10% of n jobs (by the time they ended)."""
    k = max(1, n // 10)
    first = k / max(ends[k - 1] - first_start, 1e-6)
    last = k / max(ends[n - 1] - ends[n - k - 1], 1e-6)
    return {
        "first_10pct_jobs_per_s": first,
        "last_10pct_jobs_per_s": last,
        "last_over_first": last / first,
    }


def each_decile(ends: list[float], first_start: float, n: int) -> list[float]:
    """Throughput of each tenth of n jobs (by the time they ended), first to last."""
    k = max(1, n // 10)
    bounds = [first_start] + [ends[i * k - 1] for i in range(1, 11) if i * k <= n]
    return [round(k / max(b - a, 1e-6), 1) for a, b in itertools.pairwise(bounds)]


def series(ends: list[float], t0: float, bucket_s: float) -> list[tuple[float, float]]:
    """(seconds since t0, jobs/s) per bucket of handler ends."""
    counts: dict[int, int] = {}
    for e in ends:
        counts[int((e - t0) // bucket_s)] = counts.get(int((e - t0) // bucket_s), 0) + 1
    return [(round(b * bucket_s, 1), c / bucket_s) for b, c in sorted(counts.items())]


def workload_sustained(run: Run) -> dict[str, Any]:
    """A producer and the workers together: n jobs through one queue.

    The producer keeps about `backlog` jobs ready (bulk calls of 500) and
    makes n + backlog jobs, so the last of the n measured jobs still run
    while it produces. Worker RSS and the job table's dead tuples are sampled
    as it goes.
    """
    p = run.params
    n, backlog = int(p["jobs"]), int(p["backlog"])
    a = run.adapter
    total = n + backlog
    chunk = 500
    run.load(backlog)  # a first backlog, so the table has statistics
    a.analyze()
    produced = backlog
    t_start = time.time()
    procs = run.start_workers(burst=False)
    rss: list[tuple[float, float, float]] = []
    table: list[dict[str, Any]] = []
    next_rss = next_table = 0.0
    deadline = time.monotonic() + float(p.get("timeout", 3600))
    try:
        while time.monotonic() < deadline:
            done = run.reader.count()
            now = time.time()
            if now >= next_rss:
                big, total_mb = worker_rss(procs)
                rss.append((round(now - t_start, 1), round(big, 1), round(total_mb, 1)))
                next_rss = now + 1.0
            if now >= next_table:
                # Made but not yet handled: about `backlog` while the workers keep up
                # with the producer's target, about their claim-ahead when they wait for it.
                stats = {"unfinished": produced - done, **(a.table_stats() or {})}
                table.append({"t": round(now - t_start, 1), **stats})
                next_table = now + 2.0
            if done >= n and produced >= total:
                break
            if all(proc.poll() is not None for proc in procs):
                raise RuntimeError(f"workers exited: {tail(run.log)}")
            if produced < total and produced - done < backlog:
                size = min(chunk, total - produced)
                a.enqueue_bulk(run.kind, list(range(produced, produced + size)))
                produced += size
            else:
                time.sleep(0.005)
        ok_n = run.reader.count() >= n
        # let the rest finish, then the store must show every job acknowledged
        out = run.drain(total, procs, float(p.get("timeout", 3600)), started=t_start, burst=False)
    finally:
        stop(procs)
    marks = sorted(run.reader.handled(), key=lambda m: m[1])
    ends = [m[1] for m in marks]
    first_start = min(m[0] for m in marks)
    measured = min(n, len(ends))
    out.update(deciles(ends, first_start, measured))
    out["decile_jobs_per_s"] = each_decile(ends, first_start, measured)
    stats = a.table_stats()
    if stats:
        table.append({"t": round(time.time() - t_start, 1), **stats})
    early = next((r for r in rss if r[0] >= (ends[measured // 10] - t_start)), rss[0])
    out.update(
        {
            "completed_in_time": ok_n and out["completed_in_time"],
            "jobs": n,
            "produced": produced,
            "measured_jobs_per_s": measured / max(ends[measured - 1] - first_start, 1e-6),
            "throughput_series": series(
                ends[:measured], first_start, max(0.5, (ends[measured - 1] - first_start) / 60)
            ),
            "rss_samples": rss[:: max(1, len(rss) // 120)],
            "rss_mb_at_10pct": early[1],
            "rss_mb_at_end": rss[-1][1],
            "rss_growth_mb": round(rss[-1][1] - early[1], 1),
            "table_samples": table[:: max(1, len(table) // 120)],
            "max_dead_tuples": max(
                (t["n_dead_tup"] for t in table if "n_dead_tup" in t), default=None
            ),
            "knobs": run.knobs(),
        }
    )
    return out


def workload_relay(run: Run) -> dict[str, Any]:
    return workload_drain(run)


WORKLOADS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "enqueue": workload_enqueue,
    "drain": workload_drain,
    "relay": workload_relay,
    "latency": workload_latency,
    "sustained": workload_sustained,
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
        extra = getattr(adapter, "workloads", {})
        if command == "install":
            result = adapter.install()
        elif command == "worker":
            adapter.work(params)  # type: ignore[attr-defined]
            result = {}
        elif command in WORKLOADS or command in extra:
            run = Run(adapter, params, Path(params["workdir"]))
            result = (extra.get(command) or WORKLOADS[command])(run)
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
