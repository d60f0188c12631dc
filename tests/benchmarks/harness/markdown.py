"""Markdown tables from a results document (written next to the JSON).

Every figure is printed with the load it was measured under: the highest
1-minute load average and the highest CPU share of other processes seen
before any of its runs (`load 0.4 / others 3%`).
"""

from __future__ import annotations

from typing import Any

from . import config

PEERS_ON_POSTGRES = ("procrastinate", "pgqueuer", "chancy", "django-tasks-db", "django-ox")


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _stat(summary: dict[str, Any], metric: str, digits: int = 0, spread: bool = True) -> str:
    s = summary.get(metric)
    if not s:
        return "-"
    text = _num(s["median"], digits)
    if spread and s.get("n", 1) > 1:
        text += f" [{_num(s['min'], digits)}-{_num(s['max'], digits)}]"
    return text


def _load(summary: dict[str, Any]) -> str:
    load = summary.get("load") or {}
    avg, others = load.get("loadavg_1m_max"), load.get("others_cpu_pct_before_max")
    return f"{_num(avg, 1)} / {_num(others, 0)}%"


def _best(doc: dict[str, Any], workload: str, system: str, figure: str) -> tuple[str, dict] | None:
    cell = doc["results"].get(workload, {}).get(system, {}).get(figure)
    if not isinstance(cell, dict) or not cell.get("best"):
        return None
    label = cell["best"]
    return label, cell["settings"][label]["summary"]


def _systems(doc: dict[str, Any], workload: str) -> list[str]:
    per = doc["results"].get(workload, {})
    return [s for s in doc["systems"] if isinstance(per.get(s), dict) and "skipped" not in per[s]]


def _figures(doc: dict[str, Any], workload: str) -> list[str]:
    seen: list[str] = []
    for per in doc["results"].get(workload, {}).values():
        for fig in per:
            if fig != "skipped" and fig not in seen:
                seen.append(fig)
    return seen


def _version(doc: dict[str, Any], system: str) -> str:
    v = doc["systems"].get(system, {}).get("version")
    return f"{system} {v}" if v else system


def drain_tables(doc: dict[str, Any]) -> list[str]:
    figs = _figures(doc, "drain")
    systems = _systems(doc, "drain")
    if not figs:
        return []
    jobs = doc["sizes"]["drain_jobs"]
    out = [
        f"### Drain: no-op jobs/s, best setting per system ({jobs:,} jobs, median [min-max])",
        "",
        "| system | "
        + " | ".join(f"{f}: best setting | jobs/s | load / others" for f in figs)
        + " |",
        "| --- |" + " --- | --- | --- |" * len(figs),
    ]
    for system in systems:
        row = [_version(doc, system)]
        for fig in figs:
            found = _best(doc, "drain", system, fig)
            if found:
                label, summary = found
                row += [f"`{label}`", _stat(summary, "jobs_per_s"), _load(summary)]
            else:
                row += ["-", "-", "-"]
        out.append("| " + " | ".join(row) + " |")
    sweep_rows = []
    for system in systems:
        for fig in figs:
            cell = doc["results"]["drain"][system].get(fig, {})
            for label, entry in (cell.get("sweep") or {}).items():
                sweep_rows.append(
                    f"| {system} | {fig} | `{label}` | {_stat(entry['summary'], 'jobs_per_s')} "
                    f"| {_load(entry['summary'])} |"
                )
    if sweep_rows:
        out += [
            "",
            f"Sweep ({doc['sizes']['sweep_jobs']:,} jobs, one run per setting):",
            "",
            "| system | processes | setting | jobs/s | load / others |",
            "| --- | --- | --- | --- | --- |",
            *sweep_rows,
        ]
    return out


def enqueue_table(doc: dict[str, Any]) -> list[str]:
    systems = _systems(doc, "enqueue")
    if not systems:
        return []
    out = [
        "### Enqueue",
        "",
        "| system | one call per transaction /s | bare INSERT + COMMIT /s (floor) | share of floor "
        "| one call p50 µs | bulk /s | load / others |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system in systems:
        found = _best(doc, "enqueue", system, "enqueue")
        if not found:
            continue
        s = found[1]
        share = s.get("one_per_call_share_of_floor", {}).get("median")
        out.append(
            f"| {_version(doc, system)} | {_stat(s, 'enqueue_one_per_call_per_s')} "
            f"| {_stat(s, 'floor_insert_commit_per_s')} "
            f"| {_num(100 * share if share else None)}% "
            f"| {_stat(s, 'enqueue_one_p50_us', spread=False)} "
            f"| {_stat(s, 'enqueue_bulk_per_s')} | {_load(s)} |"
        )
    return out


def latency_table(doc: dict[str, Any]) -> list[str]:
    systems = _systems(doc, "latency")
    figs = _figures(doc, "latency")
    if not systems or not figs:
        return []
    out = [
        f"### Pickup latency at {figs[0]}, from the start of the enqueue call (ms)",
        "",
        "| system | setting | p50 | p95 | p99 | from the call's return: p50 / p99 "
        "| load / others |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system in systems:
        found = _best(doc, "latency", system, figs[0])
        if not found:
            continue
        label, s = found
        out.append(
            f"| {_version(doc, system)} | `{label}` | {_stat(s, 'p50_ms', 2)} | "
            f"{_stat(s, 'p95_ms', 2, False)} | {_stat(s, 'p99_ms', 2)} | "
            f"{_stat(s, 'from_return_p50_ms', 2, False)} / "
            f"{_stat(s, 'from_return_p99_ms', 2, False)} "
            f"| {_load(s)} |"
        )
    return out


def sustained_table(doc: dict[str, Any]) -> list[str]:
    systems = _systems(doc, "sustained")
    if not systems:
        return []
    out = [
        "### Sustained: producer and workers together",
        "",
        "| system | figure | setting | jobs/s | first 10% | last 10% | last / first "
        "| worker RSS MB at 10% → end | max dead tuples | load / others |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for system in systems:
        for fig in _figures(doc, "sustained"):
            found = _best(doc, "sustained", system, fig)
            if not found:
                continue
            label, s = found
            out.append(
                f"| {_version(doc, system)} | {fig} | `{label}` "
                f"| {_stat(s, 'measured_jobs_per_s')} "
                f"| {_stat(s, 'first_10pct_jobs_per_s')} | {_stat(s, 'last_10pct_jobs_per_s')} "
                f"| {_stat(s, 'last_over_first', 2)} | {_stat(s, 'rss_mb_at_10pct', 1, False)} → "
                f"{_stat(s, 'rss_mb_at_end', 1, False)} | {_stat(s, 'max_dead_tuples', 0, False)} "
                f"| {_load(s)} |"
            )
    return out


def growth_table(doc: dict[str, Any]) -> list[str]:
    per = doc["results"].get("growth", {}).get("conveyor")
    if not isinstance(per, dict) or "skipped" in per:
        return []
    base = _best(doc, "growth", "conveyor", "base")
    base_rate = base[1]["jobs_per_s"]["median"] if base and "jobs_per_s" in base[1] else None
    out = [
        f"### Growth (django-conveyor, {doc['sizes']['growth_jobs']:,} jobs per drain)",
        "",
        "| figure | setting | jobs/s | vs base | load / others |",
        "| --- | --- | --- | --- | --- |",
    ]
    for fig in per:
        found = _best(doc, "growth", "conveyor", fig)
        if not found:
            continue
        label, s = found
        rate = s.get("jobs_per_s", {}).get("median")
        ratio = f"{rate / base_rate:.2f}" if rate and base_rate else "-"
        out.append(f"| {fig} | `{label}` | {_stat(s, 'jobs_per_s')} | {ratio} | {_load(s)} |")
    return out


def _best_of(entries: dict[str, Any], keep: Any) -> tuple[str, dict] | None:
    scored = [
        (e["summary"]["jobs_per_s"]["median"], label, e["summary"])
        for label, e in entries.items()
        if keep(e["setting"]) and "jobs_per_s" in e["summary"]
    ]
    if not scored:
        return None
    _, label, summary = max(scored, key=lambda x: x[0])
    return label, summary


def limit_table(doc: dict[str, Any]) -> list[str]:
    per = doc["results"].get("limit", {}).get("conveyor")
    if not isinstance(per, dict) or "skipped" in per:
        return []
    out = [
        "### Physical limit: CLAIM + COMPLETE of protocol.py without the worker's Python",
        "",
        "| processes | best setting (shipped SQL) | limit jobs/s | our drain (best) jobs/s "
        "| drain as share of limit | diagnostic claim variant, best | load / others |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fig, cell in per.items():
        entries = cell.get("settings", {})
        shipped = _best_of(entries, lambda st: st.get("claim", "protocol") == "protocol")
        variant = _best_of(entries, lambda st: st.get("claim", "protocol") != "protocol")
        if not shipped:
            continue
        label, s = shipped
        limit = s["jobs_per_s"]["median"]
        drain = _best(doc, "drain", "conveyor", fig)
        rate = drain[1].get("jobs_per_s", {}).get("median") if drain else None
        share = f"{100 * rate / limit:.0f}%" if rate and limit else "-"
        diag = f"{_stat(variant[1], 'jobs_per_s')} (`{variant[0]}`)" if variant else "-"
        out.append(
            f"| {fig} | `{label}` | {_stat(s, 'jobs_per_s')} | {_num(rate)} | {share} "
            f"| {diag} | {_load(s)} |"
        )
    rows = []
    for fig, cell in per.items():
        for label, entry in cell.get("settings", {}).items():
            rows.append(f"| {fig} | `{label}` | {_stat(entry['summary'], 'jobs_per_s')} |")
    out += ["", "| processes | setting | jobs/s |", "| --- | --- | --- |", *rows]
    return out


def relay_table(doc: dict[str, Any]) -> list[str]:
    systems = _systems(doc, "relay")
    figs = _figures(doc, "relay")
    if not systems:
        return []
    out = [
        "### Relay: 10 ms sleep + 1,000 sha256 rounds per job, jobs/s",
        "",
        "| system | " + " | ".join(figs) + " |",
        "| --- |" + " --- |" * len(figs),
    ]
    for system in systems:
        row = [_version(doc, system)]
        for fig in figs:
            found = _best(doc, "relay", system, fig)
            row.append(_stat(found[1], "jobs_per_s") if found else "-")
        out.append("| " + " | ".join(row) + " |")
    return out


def profile_table(doc: dict[str, Any]) -> list[str]:
    per = doc["results"].get("profile", {}).get("conveyor")
    if not isinstance(per, dict) or "skipped" in per:
        return []
    out: list[str] = []
    for cell in per.values():
        for entry in cell.get("settings", {}).values():
            for run in entry["runs"]:
                b = run.get("breakdown")
                if not b or "gil" not in b:
                    continue
                out += [
                    f"### Profile: where a worker's time per job goes ({b['jobs']:,} jobs, "
                    f"{b['wall_us_per_job']:.0f} µs wall per job)",
                    "",
                    "| category (GIL held) | µs per job |",
                    "| --- | --- |",
                ]
                out += [f"| {k} | {v:.1f} |" for k, v in b["gil"]["us_per_job"].items()]
                out.append(f"| **total with the GIL** | **{b['gil']['us_per_job_total']:.1f}** |")
                if loop := b.get("wall", {}).get("control_loop_us_per_job"):
                    out += ["", "| the control loop (wall) | µs per job |", "| --- | --- |"]
                    out += [f"| {k} | {v:.1f} |" for k, v in loop.items()]
                out += cpu_table(run.get("unprofiled"))
    return out


def cpu_table(cpu: dict[str, Any] | None) -> list[str]:
    """The profile run's unprofiled window: CPU per job of the worker and the server."""
    if not cpu:
        return []
    names = {
        "worker": "the worker process (every thread)",
        "backends": "its PostgreSQL backends",
        "server_other": "PostgreSQL's other processes",
    }
    out = [
        "",
        f"Unprofiled, {cpu['jobs']:,} jobs at {cpu['jobs_per_s']:,.0f} jobs/s: CPU per job",
        "",
        "| process | user µs | system µs | total µs | share of one core |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for key, label in names.items():
        if row := cpu.get(key):
            share = row["share_of_one_core"]  # None when the window lasted no time.
            out.append(
                f"| {label} | {row['user_us_per_job']:.1f} | {row['system_us_per_job']:.1f} "
                f"| {row['cpu_us_per_job']:.1f} | {'-' if share is None else f'{share:.0%}'} |"
            )
    if cpu.get("machine_idle_share") is not None:
        out.append(
            f"| the machine, all cores | | | {cpu['machine_busy_us_per_job']:.1f} "
            f"| idle {cpu['machine_idle_share']:.0%} |"
        )
    out += [
        "",
        f"Commits of the drain's database: {cpu['commits_per_1000_jobs']:.1f} per 1,000 jobs.",
    ]
    return out


# The worker's defaults (conveyor_worker with no flags), as the drain names them.
CONVEYOR_DEFAULT = config.label(config.NO_FLAGS["conveyor"])


def features_table(doc: dict[str, Any]) -> list[str]:
    per = doc["results"].get("features", {}).get("conveyor")
    if not isinstance(per, dict) or "skipped" in per:
        return []
    out = [
        f"### Flow control and unique jobs (django-conveyor, {doc['sizes']['growth_jobs']:,} "
        "jobs per drain, 2 processes)",
        "",
        "| figure | setting | jobs/s | vs no limit | load / others |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = _best(doc, "features", "conveyor", "no limit")
    base_rate = base[1].get("jobs_per_s", {}).get("median") if base else None
    unique = None
    for fig in per:
        found = _best(doc, "features", "conveyor", fig)
        if not found:
            continue
        label, s = found
        if fig == "unique enqueue":
            unique = s
            continue
        rate = s.get("jobs_per_s", {}).get("median")
        ratio = f"{rate / base_rate:.2f}" if rate and base_rate else "-"
        out.append(f"| {fig} | `{label}` | {_stat(s, 'jobs_per_s')} | {ratio} | {_load(s)} |")
    if unique:
        out += [
            "",
            "| enqueue | plain /s | unique /s | unique / plain | load / others |",
            "| --- | --- | --- | --- | --- |",
            f"| one call per transaction | {_stat(unique, 'single_plain_per_s')} "
            f"| {_stat(unique, 'single_unique_per_s')} "
            f"| {_stat(unique, 'single_unique_over_plain', 2, False)} | {_load(unique)} |",
            f"| enqueue_many, 10% repeated calls | {_stat(unique, 'bulk_plain_per_s')} "
            f"| {_stat(unique, 'bulk_unique_per_s')} "
            f"| {_stat(unique, 'bulk_unique_over_plain', 2, False)} | {_load(unique)} |",
        ]
    return out


def targets(doc: dict[str, Any]) -> list[str]:
    """The performance issue's targets, checked against this document's figures."""
    res = doc["results"]
    rows: list[str] = []

    def med(workload: str, system: str, fig: str, metric: str) -> float | None:
        found = _best(doc, workload, system, fig)
        return found[1].get(metric, {}).get("median") if found else None

    def best_peer(
        workload: str, fig: str, metric: str, among: tuple[str, ...] | None = None
    ) -> tuple[float, str] | None:
        names = [p for p in res.get(workload, {}) if p != "conveyor" and (not among or p in among)]
        found = [(v, p) for v, p in ((med(workload, p, fig, metric), p) for p in names) if v]
        return max(found) if found else None

    def row(target: str, result: str, met: bool) -> None:
        rows.append(f"| {target} | {result} | {'met' if met else 'missed'} |")

    limits = res.get("limit", {}).get("conveyor", {})
    for fig in _figures(doc, "drain"):
        ours = med("drain", "conveyor", fig, "jobs_per_s")
        shipped = _best_of(
            limits.get(fig, {}).get("settings", {}),
            lambda st: st.get("claim", "protocol") == "protocol",
        )
        limit = shipped[1]["jobs_per_s"]["median"] if shipped else None
        if ours and limit:
            row(f"drain {fig} ≥ 90% of the statement limit", f"{ours / limit:.0%} of {limit:,.0f}",
                ours >= 0.9 * limit)  # fmt: skip
        peer = best_peer("drain", fig, "jobs_per_s")
        if ours and peer:
            result = f"{ours / peer[0]:.2f}x ({peer[1]} {peer[0]:,.0f})"
            row(f"drain {fig} ≥ 1.5x best peer", result, ours >= 1.5 * peer[0])
        cell = res.get("drain", {}).get("conveyor", {}).get(fig, {})

        def medians(group: str, cell: dict[str, Any] = cell) -> dict[str, float]:
            return {
                label: e["summary"]["jobs_per_s"]["median"]
                for label, e in cell.get(group, {}).items()
                if "jobs_per_s" in e.get("summary", {})
            }

        # The final drains (no flags beside the best swept, full size, every
        # repetition) when they ran; else the sweep's single runs (older files).
        finals, swept = medians("settings"), medians("sweep")
        compared, how = (finals, "final drains") if CONVEYOR_DEFAULT in finals else (swept, "sweep")
        if CONVEYOR_DEFAULT in compared:
            share = compared[CONVEYOR_DEFAULT] / max(compared.values())
            row(f"fast by default, {fig}: no flags ≥ 90% of the best", f"{share:.0%} ({how})",
                share >= 0.9)  # fmt: skip
    one = _best_of(limits.get("1 process", {}).get("settings", {}), lambda st: True)
    if one:
        rate = one[1]["jobs_per_s"]["median"]
        row("statement limit ≥ 40,000 jobs/s on one connection", f"{rate:,.0f}", rate >= 40_000)
    ours = med("enqueue", "conveyor", "enqueue", "enqueue_one_per_call_per_s")
    floor = med("enqueue", "conveyor", "enqueue", "floor_insert_commit_per_s")
    if ours and floor:
        row("one call per transaction ≥ 80% of the floor", f"{ours / floor:.0%} of {floor:,.0f}/s",
            ours >= 0.8 * floor)  # fmt: skip
    # Against the PostgreSQL peers: a Redis push is not a committed transaction.
    peer = best_peer("enqueue", "enqueue", "enqueue_one_per_call_per_s", PEERS_ON_POSTGRES)
    if ours and peer:
        row("one call per transaction ≥ every peer", f"{ours:,.0f} vs {peer[1]} {peer[0]:,.0f}",
            ours >= peer[0])  # fmt: skip
    bulk = med("enqueue", "conveyor", "enqueue", "enqueue_bulk_per_s")
    pgqueuer = med("enqueue", "pgqueuer", "enqueue", "enqueue_bulk_per_s")
    if bulk and pgqueuer:
        row("bulk enqueue ≥ 1.2x pgqueuer", f"{bulk / pgqueuer:.2f}x ({bulk:,.0f} vs "
            f"{pgqueuer:,.0f})", bulk >= 1.2 * pgqueuer)  # fmt: skip
    for fig in _figures(doc, "latency"):
        p50 = med("latency", "conveyor", fig, "p50_ms")
        p99 = med("latency", "conveyor", fig, "p99_ms")
        if p50 is not None and p99 is not None:
            row(f"pickup at {fig} from the call's start: p50 ≤ 1.5 ms, p99 ≤ 4 ms",
                f"{p50:.2f} / {p99:.2f} ms", p50 <= 1.5 and p99 <= 4.0)  # fmt: skip
    for fig in _figures(doc, "sustained"):
        ratio = med("sustained", "conveyor", fig, "last_over_first")
        growth = med("sustained", "conveyor", fig, "rss_growth_mb")
        if ratio is not None:
            row("sustained: last 10% ≥ 90% of first 10%",
                f"{ratio:.2f} (RSS {growth or 0:+.1f} MB)", ratio >= 0.9)  # fmt: skip
    base = med("growth", "conveyor", "base", "jobs_per_s")
    for fig in ("finished-1e6", "ready-1e6", "ready-other-queue-1e6", "processes-8", "queues-100"):
        rate = med("growth", "conveyor", fig, "jobs_per_s")
        if rate and base:
            row(f"growth {fig} no slower than base", f"{rate / base:.2f}x", rate >= 0.9 * base)
    single = med("features", "conveyor", "unique enqueue", "single_unique_over_plain")
    many = med("features", "conveyor", "unique enqueue", "bulk_unique_over_plain")
    if single is not None:
        row("unique enqueue, one call: within 15% of plain", f"{single:.2f}x", single >= 0.85)
    if many is not None:
        row("unique enqueue_many: within 1.5x of plain", f"{many:.2f}x", many >= 1 / 1.5)
    if not rows:
        return []
    return [
        "### Against the targets of the issue",
        "",
        "| target | result | |",
        "| --- | --- | --- |",
        *rows,
    ]


def render(doc: dict[str, Any]) -> str:
    pg_version = doc.get("postgres", {}).get("settings", {}).get("server_version", "?")
    head = [
        f"# Benchmark {doc.get('date')} ({'quick' if doc.get('quick') else 'full'} run)",
        "",
        f"`{doc.get('command')}`: {doc['machine'].get('cores')} cores, "
        f"{doc['machine'].get('cpu_model')}; PostgreSQL {pg_version}; "
        f"duration {doc.get('duration_s', '?')} s. Load beside each figure: the highest "
        "1-minute load average / the highest CPU share of other processes before its runs.",
        "",
    ]
    parts = [
        drain_tables(doc),
        enqueue_table(doc),
        latency_table(doc),
        sustained_table(doc),
        growth_table(doc),
        features_table(doc),
        limit_table(doc),
        relay_table(doc),
        profile_table(doc),
        targets(doc),
    ]
    body: list[str] = []
    for part in parts:
        if part:
            body += [*part, ""]
    return "\n".join(head + body)
