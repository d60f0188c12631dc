"""A job's workflow in the admin: its neighbours on the job page, and the graph as SVG.

The graph is drawn on the server (no script, no internet): the connected
part of the dependency graph around a job, up to NODE_LIMIT jobs, laid out
in columns by depth (each job right of everything it waits for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import Dependency, Job

NODE_LIMIT = 300  # Jobs drawn at most; a 10,000-job fan-out shows its first ones.
NEIGHBOUR_LIMIT = 100  # Dependencies (and dependents) listed on the job page.
NODE_WIDTH, NODE_HEIGHT = 170, 38
COLUMN_GAP, ROW_GAP = 60, 12
MARGIN = 10
# Fill and text colours of a node per state, the badges' colours (admin.css).
STATE_COLOURS = {
    "blocked": ("#f2f2f2", "#555555"),
    "available": ("#e6f0fa", "#1d4e89"),
    "running": ("#cfe2f7", "#1d4e89"),
    "completed": ("#e7f5e9", "#1b5e20"),
    "failed": ("#fdecea", "#a12622"),
    "dead": ("#fdecea", "#a12622"),
    "cancelled": ("#ebebeb", "#555555"),
}

# Both directions from one job, breadth first; the outer LIMIT stops the walk.
COMPONENT = """
WITH RECURSIVE reach(id) AS (
    SELECT %(id)s::bigint
    UNION
    SELECT CASE WHEN d.job_id = r.id THEN d.depends_on_id ELSE d.job_id END
    FROM reach AS r
    JOIN conveyor_dependency AS d ON d.job_id = r.id OR d.depends_on_id = r.id
)
SELECT id FROM reach LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class Neighbour:
    id: int
    task_name: str
    state: str
    url: str


@dataclass(frozen=True, slots=True)
class Neighbours:
    dependencies: list[Neighbour]
    dependents: list[Neighbour]
    more_dependencies: int  # Past NEIGHBOUR_LIMIT, not listed.
    more_dependents: int

    @property
    def any(self) -> bool:
        return bool(self.dependencies or self.dependents)


def _neighbour(job: Job) -> Neighbour:
    name = f"gate: {waits_for(job)}" if job.gate else job.task_name
    return Neighbour(job.id, name, job.state, reverse("admin:conveyor_job_change", args=[job.id]))


def _neighbours(database: str, ids_query: Any) -> tuple[list[Neighbour], int]:
    jobs = (
        Job.objects.using(database)
        .filter(pk__in=ids_query)
        .only("id", "task_path", "state", "gate", "pending_dependencies")
    )
    rows = list(jobs.order_by("id")[: NEIGHBOUR_LIMIT + 1])
    listed = [_neighbour(j) for j in rows[:NEIGHBOUR_LIMIT]]
    more = ids_query.count() - NEIGHBOUR_LIMIT if len(rows) > NEIGHBOUR_LIMIT else 0
    return listed, more


def neighbours(job: Job, database: str) -> Neighbours:
    """What the job waits for and what waits for it, with their states."""
    edges = Dependency.objects.using(database)
    deps, more_deps = _neighbours(
        database, edges.filter(job_id=job.pk).values_list("depends_on_id", flat=True)
    )
    dependents, more_dependents = _neighbours(
        database, edges.filter(depends_on_id=job.pk).values_list("job_id", flat=True)
    )
    return Neighbours(deps, dependents, more_deps, more_dependents)


@dataclass(frozen=True, slots=True)
class Graph:
    nodes: dict[int, Job]
    edges: list[tuple[int, int]]  # (job, depends_on), both in `nodes`.
    truncated: bool  # More jobs belong to the workflow than NODE_LIMIT.

    def depths(self) -> dict[int, int]:
        """Each node's column: one more than the deepest node it waits for."""
        waits_for: dict[int, list[int]] = {n: [] for n in self.nodes}
        for job, dep in self.edges:
            waits_for[job].append(dep)
        depth: dict[int, int] = {}
        for start in sorted(self.nodes):
            stack = [start]
            while stack:
                node = stack[-1]
                pending = [d for d in waits_for[node] if d not in depth]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                depth[node] = max((depth[d] + 1 for d in waits_for[node]), default=0)
        return depth


def workflow_graph(job_id: int, database: str, limit: int | None = None) -> Graph:
    """The jobs connected to `job_id` (at most `limit`, default NODE_LIMIT) and their edges."""
    limit = NODE_LIMIT if limit is None else limit
    with connections[database].cursor() as cursor:
        cursor.execute(COMPONENT, {"id": job_id, "limit": limit + 1})
        ids = [row[0] for row in cursor.fetchall()]
    truncated = len(ids) > limit
    ids = ids[:limit]
    nodes = {
        j.id: j
        for j in Job.objects.using(database)
        .filter(pk__in=ids)
        .only("id", "task_path", "state", "gate", "pending_dependencies")
    }
    edges = list(
        Dependency.objects.using(database)
        .filter(job_id__in=ids, depends_on_id__in=ids)
        .values_list("job_id", "depends_on_id")
    )
    return Graph(nodes, edges, truncated)


def listed(graph: Graph) -> list[Neighbour]:
    """The graph's jobs as the job page lists its neighbours, in id order."""
    return [_neighbour(graph.nodes[n]) for n in sorted(graph.nodes)]


def svg(graph: Graph, current: int) -> SafeString:
    """The graph as an SVG drawing: a box per job (linked, coloured by state), arrows."""
    depths = graph.depths()
    columns: dict[int, list[int]] = {}
    for node in sorted(graph.nodes):
        columns.setdefault(depths[node], []).append(node)
    place: dict[int, tuple[int, int]] = {}
    for column, nodes in columns.items():
        for row, node in enumerate(nodes):
            x = MARGIN + column * (NODE_WIDTH + COLUMN_GAP)
            place[node] = (x, MARGIN + row * (NODE_HEIGHT + ROW_GAP))
    width = MARGIN * 2 + max(len(columns), 1) * (NODE_WIDTH + COLUMN_GAP) - COLUMN_GAP
    rows = max((len(n) for n in columns.values()), default=1)
    height = MARGIN * 2 + rows * (NODE_HEIGHT + ROW_GAP) - ROW_GAP
    arrows = format_html_join(
        "",
        "<path class='conveyor-edge' data-from='{}' data-to='{}' d='M{} {} C{} {} {} {} {} {}' "
        "marker-end='url(#conveyor-arrow)'/>",
        (_edge(dep, job, place) for job, dep in graph.edges),
    )
    boxes = format_html_join(
        "", "{}", ((_node(graph.nodes[n], place[n], n == current),) for n in sorted(graph.nodes))
    )
    return format_html(
        "<svg class='conveyor-workflow' xmlns='http://www.w3.org/2000/svg' role='img' "
        "aria-label='workflow graph' width='{}' height='{}' viewBox='0 0 {} {}'>"
        "<defs><marker id='conveyor-arrow' viewBox='0 0 10 10' refX='10' refY='5' "
        "markerWidth='7' markerHeight='7' orient='auto-start-reverse'>"
        "<path d='M0 0 L10 5 L0 10 z' fill='#888'/></marker></defs>"
        "<g fill='none' stroke='#888' stroke-width='1.2'>{}</g>{}</svg>",
        width,
        height,
        width,
        height,
        arrows,
        boxes,
    )


def _edge(source: int, target: int, place: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    (x1, y1), (x2, y2) = place[source], place[target]
    x1, y1, y2 = x1 + NODE_WIDTH, y1 + NODE_HEIGHT // 2, y2 + NODE_HEIGHT // 2
    bend = (x2 - x1) // 2
    return (source, target, x1, y1, x1 + bend, y1, x2 - bend, y2, x2, y2)


def waits_for(job: Job) -> str:
    """What a gate waits for, in words ("" for a job that is not a gate)."""
    gate = job.gate or {}
    kind = gate.get("kind")
    if kind == "signal":
        text = f"signal “{gate.get('signal')}”"
    elif kind == "sleep":
        text = "timer"
    elif kind == "condition":
        text = f"a row of {(gate.get('condition') or {}).get('model', '?')}"
    else:
        return ""
    if job.state == "blocked" and job.pending_dependencies:
        return f"{text}, after {job.pending_dependencies} upstream step(s)"
    return text


def _node(job: Job, at: tuple[int, int], current: bool) -> SafeString:
    if job.gate:
        return _gate_node(job, at, current)
    fill, ink = STATE_COLOURS.get(job.state, ("#ffffff", "#000000"))
    x, y = at
    url = reverse("admin:conveyor_job_change", args=[job.pk])
    stroke, stroke_width = ("#1d4e89", 2.5) if current else ("#999999", 1)
    return format_html(
        "<a href='{}'><g class='conveyor-node' data-job='{}' data-state='{}'>"
        "<title>job {} ({}): {}</title>"
        "<rect x='{}' y='{}' width='{}' height='{}' rx='6' fill='{}' stroke='{}' "
        "stroke-width='{}'/>"
        "<text x='{}' y='{}' font-size='12' fill='{}'>{} #{}</text>"
        "<text x='{}' y='{}' font-size='11' fill='{}'>{}</text></g></a>",
        url,
        job.pk,
        job.state,
        job.pk,
        job.task_path,
        job.state,
        x,
        y,
        NODE_WIDTH,
        NODE_HEIGHT,
        fill,
        stroke,
        stroke_width,
        x + 8,
        y + 15,
        ink,
        job.task_name[:18],
        job.pk,
        x + 8,
        y + 30,
        ink,
        job.state,
    )


def _gate_node(job: Job, at: tuple[int, int], current: bool) -> SafeString:
    """A gate: a dashed box saying what it waits for (no handler runs it)."""
    fill, ink = STATE_COLOURS.get(job.state, ("#ffffff", "#000000"))
    x, y = at
    url = reverse("admin:conveyor_job_change", args=[job.pk])
    stroke_width = 2.5 if current else 1.5
    waits = waits_for(job)
    return format_html(
        "<a href='{}'><g class='conveyor-node conveyor-gate' data-job='{}' data-state='{}' "
        "data-waits='{}'><title>gate {} ({}): waits for {}</title>"
        "<rect x='{}' y='{}' width='{}' height='{}' rx='14' fill='{}' stroke='#1d4e89' "
        "stroke-width='{}' stroke-dasharray='5 3'/>"
        "<text x='{}' y='{}' font-size='12' fill='{}'>gate #{}: {}</text>"
        "<text x='{}' y='{}' font-size='11' fill='{}'>{}</text></g></a>",
        url, job.pk, job.state, waits, job.pk, job.state, waits,
        x, y, NODE_WIDTH, NODE_HEIGHT, fill, stroke_width,
        x + 8, y + 15, ink, job.pk, waits.split(",")[0][:14],
        x + 8, y + 30, ink, job.state,
    )  # fmt: skip
