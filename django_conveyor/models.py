"""The tables of the public contract (DESIGN §3).

Rows of `conveyor_job` change state only through `protocol.py`; the models
exist for reading (admin, get_result) and for migrations. Their timestamps
and JSON load whatever a row holds (readable.py): a page never fails on a
value Python cannot represent.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models
from django.db.models import JSONField, Q, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce

from .readable import InstantField, TolerantJSONDecoder
from .states import JobState

PRIORITY_RANGE = Q(priority__gte=-100) & Q(priority__lte=100)
# The window of a unique key without a period, in its index only: PostgreSQL
# 14 has no NULLS NOT DISTINCT, and NULL windows must collide.
UNIQUE_NO_WINDOW = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# A keyed job holds its key while its state is one of its own blocking states.
HOLDS_KEY = Q(unique_states__has_key=models.F("state"))
# The predicate of the secondary indexes that leave running rows out
# (conveyor_job_reap_idx has those); a query's state <> 'running' implies it.
NOT_RUNNING = ~Q(state="running")


def unique_key_is(key: str) -> Q:
    """Every job with this unique key, in every window: the one holding it (through
    conveyor_job_unique_key_uniq) and those that held it (conveyor_job_released_key_idx).
    Each arm implies one index's predicate, so PostgreSQL reads both."""
    return Q(unique_key=key) & HOLDS_KEY | Q(unique_key=key) & ~HOLDS_KEY


def tolerant_json(**options: Any) -> models.JSONField:
    """A JSON column every read can load (readable.py): numbers past Python's limits too."""
    return models.JSONField(decoder=TolerantJSONDecoder, **options)


class DependencyPolicy(models.TextChoices):
    """What a dependency that ends failed, dead or cancelled does to its dependent."""

    CANCEL = "cancel", "cancel: the dependent is cancelled"
    RUN = "run", "run: the dependent runs once every dependency is final"


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    task_path = models.CharField(max_length=255)
    args = tolerant_json(default=list)
    kwargs = tolerant_json(default=dict)
    queue = models.CharField(max_length=64, default="default")
    backend = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.AVAILABLE)
    attempt = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=5)
    run_after = InstantField()  # When the job is next due (retries and snoozes move it).
    # The run_after it was enqueued with (None: not deferred), as get_result() reports it.
    enqueued_run_after = InstantField(null=True, blank=True)
    lease_owner = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    lease_version = models.BigIntegerField(default=0)
    lease_expires_at = InstantField(null=True, blank=True)
    # NULL, not "", for unkeyed jobs: the unique index (conveyor_job_idempotency_key_uniq)
    # holds keyed rows only, so the claims and completions of the others do not
    # write to it.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    errors = tolerant_json(default=list, blank=True)
    return_value = tolerant_json(null=True, blank=True)
    enqueued_at = InstantField()
    started_at = InstantField(null=True, blank=True)
    finished_at = InstantField(null=True, blank=True)
    # Operator history: {"time", "actor", "action", "detail"}, appended by
    # REQUEUE, CANCEL, REQUEST_CANCEL and CANCEL_HELD. The database default
    # covers every INSERT statement, whoever writes it.
    history = tolerant_json(default=list, db_default=Value([], JSONField()), blank=True)
    # A cancel request on a running job (REQUEST_CANCEL); REQUEUE clears it.
    cancel_requested_at = InstantField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # Crash containment: REAP sets it on a job whose lease expired, which CLAIM
    # then leaves to CLAIM_ISOLATED (one per worker, without claim-ahead
    # siblings) until an outcome of its handler is written. REQUEUE clears it.
    isolated = models.BooleanField(default=False, db_default=False)
    # Workflows (docs/workflows.md): dependencies not yet satisfied, and what
    # a failed dependency does to this job. Database defaults cover every INSERT.
    pending_dependencies = models.IntegerField(default=0, db_default=0)
    dependency_policy = models.CharField(
        max_length=8,
        choices=DependencyPolicy.choices,
        default=DependencyPolicy.CANCEL,
        db_default=DependencyPolicy.CANCEL.value,
    )
    # Gates (docs/workflows.md, "Workflows that wait"): what a gate waits for
    # (NULL: a job to run), and when it stops waiting at the latest, set when
    # it starts to wait. Written by ENQUEUE and the gate statements of protocol.py.
    gate = tolerant_json(null=True, blank=True)
    gate_deadline = InstantField(null=True, blank=True)
    # Observability (docs/observability.md): the progress a running handler
    # reported ({current, total, message, attempt, updated_at}), written by
    # HEARTBEAT_PROGRESS under the attempt's token. NULL until one is reported.
    progress = tolerant_json(null=True, blank=True)
    # Labels given at enqueue (task.using(tags=..., meta=...)); NULL, never
    # empty, when there are none, so such a job has no entry in their partial
    # GIN indexes (docs/observability.md#what-it-costs).
    tags = tolerant_json(null=True, blank=True)  # A JSON array of strings.
    meta = tolerant_json(null=True, blank=True)

    # Unique jobs (docs/unique-jobs.md), all NULL for a job without `unique`:
    # the key (a hex SHA-256 of what `by` names), the start of its period
    # bucket (from the database's now()), the states in which the job holds
    # the key (the unique index's predicate reads them), and what the key was
    # made of ({"by", "key", "period", "on_duplicate", "replaced", "replaced_at"}).
    unique_key = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    unique_window = InstantField(null=True, blank=True)
    unique_states = tolerant_json(null=True, blank=True)  # A list of state names.
    uniqueness = tolerant_json(null=True, blank=True)
    # Flow control (docs/flow-control.md): the key a queue's `key_concurrency`
    # and `fair` share count by. NULL, never "", for a job without one: it has
    # no entry in the two keyed indexes below.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "conveyor_job"
        # PostgreSQL's (conveyor.E020 refuses any other engine): said once by E020,
        # not again by a warning per index on SQLite.
        required_db_features = {
            "supports_partial_indexes", "supports_covering_indexes", "supports_expression_indexes",
        }  # fmt: skip
        ordering = ["-id"]
        permissions = [
            ("operate", "Can requeue and cancel jobs and pause queues"),
            ("view_payloads", "Can see job arguments, return values and tracebacks"),
        ]
        indexes = [
            # The claim path: only ready rows, in claim order, so its cost
            # does not grow with finished history. Queue is a filter, not a
            # key column, so one ordered scan serves a worker of many queues.
            models.Index(
                models.F("priority").desc(),
                "run_after",
                "id",
                name="conveyor_job_claim_idx",
                condition=Q(state="available"),
            ),
            # CLAIM_ISOLATED's path: the few reaped jobs waiting to run alone.
            # CLAIM filters them out of the claim index above (NOT isolated).
            models.Index(
                models.F("priority").desc(),
                "run_after",
                "id",
                name="conveyor_job_isolated_idx",
                condition=Q(state="available", isolated=True),
            ),
            # CLAIM_ISOLATED's guard: does this worker run an isolated job? (one row at most)
            models.Index(
                "lease_owner",
                name="conveyor_job_isolated_held_idx",
                condition=Q(state="running", isolated=True),
            ),
            # The claim path of a worker of one queue: its own ready rows in
            # claim order, however many rows of other queues come first.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="conveyor_job_claim_queue_idx",
                condition=Q(state="available"),
            ),
            # The running jobs: the reaper's expired leases, and every read of
            # running rows by queue (the counts, a limit's running jobs, the
            # lists), which the secondary indexes below leave out. Running
            # rows are few (the leases workers hold), so the reaper reads
            # them all and sorts the expired ones.
            models.Index(
                "queue",
                "lease_expires_at",
                name="conveyor_job_reap_idx",
                condition=Q(state="running"),
            ),
            # Pruning and the dashboard's throughput chart read it; queue and
            # state in the index spare them a heap visit per finished row.
            models.Index(
                fields=["finished_at", "queue"],
                include=["state"],
                name="conveyor_job_finished_idx",
                condition=Q(state__in=["completed", "failed", "dead", "cancelled"]),
            ),
            # The admin's filters, each in the list's order (newest first), so
            # a page is an index range scan whatever the table's size. A state
            # filter reads conveyor_job_list_idx below.
            # Without running rows (migration 0016): a claim and a heartbeat
            # then write no entry into these three, only a completion does.
            # A read that needs running rows reads them through
            # conveyor_job_reap_idx (admin/base.py, api/listing.py,
            # queue_counts.py); one with a state other than running implies
            # the predicate and uses them as before.
            models.Index("queue", "id", name="conveyor_job_queue_id_idx", condition=NOT_RUNNING),
            models.Index("task_path", "id", name="conveyor_job_task_id_idx", condition=NOT_RUNNING),
            models.Index(
                "id",
                name="conveyor_job_dead_letter_idx",
                condition=Q(state__in=["failed", "dead"]),
            ),
            # Counts per (state, queue) for the console, /queues and the
            # metrics (django_conveyor.queue_counts), the API's keyset pages (one
            # range per (state, queue), in id order) and the console's state
            # filter.
            models.Index(
                fields=["state", "queue", "id"], name="conveyor_job_list_idx", condition=NOT_RUNNING
            ),
            # Gates: the gates service's due timers and timeouts, and the
            # waiting gates by kind (the Waiting page, conditions, metrics).
            # Partial: a job that is not a gate has no entry in either.
            models.Index(
                fields=["gate_deadline"],
                name="conveyor_job_gate_due_idx",
                condition=Q(state="blocked", gate_deadline__isnull=False),
            ),
            models.Index(
                KeyTextTransform("kind", "gate"),
                "id",
                name="conveyor_job_gate_waiting_idx",
                condition=Q(state="blocked", gate__isnull=False),
            ),
            # Unique jobs: the keyed jobs that do not hold their key (they
            # finished), for the search of every job with a key. Its predicate
            # is the complement of the unique index's, so a keyed job has one
            # entry in one of the two, never two (unique_key_is() reads both).
            models.Index(
                fields=["unique_key", "id"],
                name="conveyor_job_released_key_idx",
                condition=Q(unique_key__isnull=False) & ~HOLDS_KEY,
            ),
            # Flow control: the keys with ready jobs of a queue, each key's
            # ready jobs in claim order (CLAIM_LIMITED walks the keys from the
            # queue's cursor), and each key's running jobs (its count). Partial:
            # a job without a key has an entry in neither.
            models.Index(
                "queue",
                "concurrency_key",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="conveyor_job_key_ready_idx",
                condition=Q(state="available", concurrency_key__isnull=False),
            ),
            models.Index(
                "queue",
                "concurrency_key",
                name="conveyor_job_key_running_idx",
                condition=Q(state="running", concurrency_key__isnull=False),
            ),
            # Search also reads conveyor_job_tags_idx and conveyor_job_meta_idx,
            # partial GIN indexes that migration 0014 creates in SQL: Django's
            # GinIndex would make django.contrib.postgres a required app.
        ]
        constraints = [
            # Partial: most jobs have no key, and every claim and completion of a
            # row writes a new entry in each index that covers it.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="conveyor_job_idempotency_key_uniq",
            ),
            models.CheckConstraint(condition=PRIORITY_RANGE, name="conveyor_job_priority_range"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in JobState]), name="conveyor_job_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="conveyor_job_max_attempts_positive"
            ),
            models.CheckConstraint(
                condition=Q(dependency_policy__in=[p.value for p in DependencyPolicy]),
                name="conveyor_job_dependency_policy_valid",
            ),
            # Unique jobs: one job per key and window among the states the job
            # itself names. The predicate reads the row's own state, so the
            # statement that moves a job out of those states frees its key; a
            # job without a key has no entry (its claims and completions write
            # none). protocol.py repeats the predicate verbatim (_HOLDS_KEY).
            models.UniqueConstraint(
                models.F("unique_key"),
                Coalesce("unique_window", Value(UNIQUE_NO_WINDOW)),
                condition=Q(unique_key__isnull=False) & HOLDS_KEY,
                name="conveyor_job_unique_key_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} #{self.pk} ({self.state})"

    @property
    def task_name(self) -> str:
        return self.task_path.rsplit(".", 1)[-1]


class Dependency(models.Model):
    """An edge of a workflow: `job` runs after `depends_on` (protocol.ENQUEUE writes it)."""

    pk = models.CompositePrimaryKey("job", "depends_on")
    # No index of their own: the primary key leads with job, the index below with depends_on.
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="dependency_edges", db_index=False
    )
    depends_on = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="dependent_edges", db_index=False
    )

    class Meta:
        db_table = "conveyor_dependency"
        indexes = [
            # UNBLOCK, CANCEL_DEPENDENTS and REBLOCK_DEPENDENTS go from a job
            # to its dependents; the primary key serves the other direction.
            models.Index(fields=["depends_on", "job"], name="conveyor_dependency_rev_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.depends_on_id}"


class DeadLetter(Job):
    """Failed and dead jobs, for the admin's dead-letter view."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters (failed and dead jobs)"


class WaitingGate(Job):
    """Gates that wait (a signal, a timer, a row condition), for the admin's Waiting page."""

    class Meta:
        proxy = True
        verbose_name = "waiting gate"
        verbose_name_plural = "waiting (gates: approvals, signals, timers, conditions)"


class Queue(models.Model):
    name = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    paused_at = InstantField(null=True, blank=True)
    # Flow control (docs/flow-control.md), enforced by protocol.CLAIM_LIMITED
    # under this row's lock. NULL (False): no such limit. Migration 0015 adds
    # the claim's own bookkeeping in SQL only (fair_cursor, rate_times,
    # rate_counts): no code but that statement reads or writes them.
    concurrency = models.IntegerField(null=True, blank=True)
    key_concurrency = models.IntegerField(null=True, blank=True)
    rate_count = models.IntegerField(null=True, blank=True)  # Starts per rate_seconds.
    rate_seconds = models.IntegerField(null=True, blank=True)
    fair = models.BooleanField(default=False, db_default=False)
    # What CONVEYOR["QUEUES"] declared when a worker last synced it: a sync
    # writes the limits only when the declaration changed, so an operator's
    # edit stands until the settings change.
    declared_limits = tolerant_json(null=True, blank=True)
    limits_changed_at = InstantField(null=True, blank=True)
    limits_changed_by = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "conveyor_queue"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                name="conveyor_queue_concurrency_positive",
            ),
            models.CheckConstraint(
                condition=Q(key_concurrency__isnull=True) | Q(key_concurrency__gte=1),
                name="conveyor_queue_key_concurrency_positive",
            ),
            models.CheckConstraint(
                condition=Q(rate_count__isnull=True, rate_seconds__isnull=True)
                | Q(rate_count__gte=1, rate_seconds__gte=1),
                name="conveyor_queue_rate_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (paused)" if self.paused else self.name


class LedgerEntry(models.Model):
    """One applied effect: written inside the job's guarded transaction."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="ledger_entries")
    effect_key = models.CharField(max_length=255)
    lease_version = models.BigIntegerField()
    worker = models.CharField(max_length=64)
    applied_at = InstantField()
    # A checkpointed step's recorded result (effect key `checkpoint:<name>`).
    value = tolerant_json(null=True, blank=True)

    class Meta:
        db_table = "conveyor_ledger"
        ordering = ["-id"]
        verbose_name = "ledger entry"
        verbose_name_plural = "ledger entries"
        constraints = [
            models.UniqueConstraint(fields=["job", "effect_key"], name="conveyor_ledger_once"),
        ]

    def __str__(self) -> str:
        return f"{self.effect_key} of job {self.job_id} (v{self.lease_version})"


class JobLog(models.Model):
    """The log records one attempt's handler emitted (docs/observability.md#per-attempt-logs).

    One row per attempt (the job and its token), written with the attempt's
    outcome, in its transaction, only when the fence accepted that outcome.
    """

    id = models.BigAutoField(primary_key=True)
    # The unique constraint below is the index by job; none of its own.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="logs", db_index=False)
    lease_version = models.BigIntegerField()
    attempt = models.IntegerField()
    worker = models.CharField(max_length=64)
    records = tolerant_json(default=list)  # [{time, level, logger, message}], oldest first.
    dropped = models.IntegerField(default=0)  # Records past the bound, counted, not kept.
    written_at = InstantField()

    class Meta:
        db_table = "conveyor_job_log"
        ordering = ["job", "lease_version"]
        verbose_name = "attempt log"
        constraints = [
            models.UniqueConstraint(
                fields=["job", "lease_version"], name="conveyor_job_log_attempt_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"log of job {self.job_id}, attempt {self.attempt}"


class MissedTicks(models.TextChoices):
    """What a schedule does with ticks no scheduler enqueued in time (docs/cron.md)."""

    LATEST = "latest", "latest: run the most recent missed tick once"
    ALL = "all", "all: backfill every missed tick (capped)"
    SKIP = "skip", "skip: drop missed ticks"


class Cron(models.Model):
    """One periodic schedule; its ticks become jobs through protocol.CRON_ENQUEUE."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100, unique=True)  # Part of every tick's job key.
    schedule = models.CharField(max_length=255, help_text="A cron expression (5 or 6 fields).")
    timezone = models.CharField(max_length=64, default="UTC", help_text="An IANA time zone.")
    task_path = models.CharField(max_length=255)
    args = tolerant_json(default=list, blank=True)
    kwargs = tolerant_json(default=dict, blank=True)
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=0)
    missed = models.CharField(max_length=8, choices=MissedTicks.choices, default="latest")
    enabled = models.BooleanField(default=True)
    # True while CONVEYOR["CRON"] declares it: settings own the row (read-only in the admin).
    declared = models.BooleanField(default=False)
    next_tick_at = InstantField(null=True, blank=True)  # The next tick not yet enqueued.
    last_tick_at = InstantField(null=True, blank=True)  # The latest tick enqueued.
    last_job_id = models.BigIntegerField(null=True, blank=True)  # The job of that tick.
    created_at = InstantField(auto_now_add=True)
    updated_at = InstantField(auto_now=True)

    class Meta:
        db_table = "conveyor_cron"
        required_db_features = {"supports_partial_indexes"}  # As Job's: E020 says it once.
        ordering = ["name"]
        verbose_name = "periodic schedule"
        indexes = [
            # The scheduler's only read: the due rows, and the earliest next tick.
            models.Index("next_tick_at", name="conveyor_cron_due_idx", condition=Q(enabled=True)),
        ]
        constraints = [
            models.CheckConstraint(condition=PRIORITY_RANGE, name="conveyor_cron_priority_range"),
            models.CheckConstraint(
                condition=Q(missed__in=[m.value for m in MissedTicks]),
                name="conveyor_cron_missed_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.schedule} {self.timezone})"


class Dashboard(Queue):
    """The console's overview page in the admin (a view over the queues)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class JobIdsField(models.Field):
    """A `bigint[]` of job ids, written and read by SQL alone: no need for
    django.contrib.postgres (and its ArrayField) in INSTALLED_APPS."""

    description = "job ids (bigint[])"

    def db_type(self, connection: Any) -> str:
        return "bigint[]"


class Worker(models.Model):
    """A live (or recently stopped or lost) worker process, refreshed with its heartbeat.

    Written by the worker registry service (`worker/services/registry.py`),
    and `may_start` by the worker's claim cycle (protocol.DECLARE_STARTS).
    """

    id = models.CharField(max_length=64, primary_key=True)  # The lease_owner it writes.
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = tolerant_json(default=list)
    concurrency = models.IntegerField()
    started_at = InstantField()
    last_seen_at = InstantField()
    leases_held = models.IntegerField(default=0)
    version = models.CharField(max_length=32)  # django-conveyor's version.
    stopped_at = InstantField(null=True, blank=True)  # A clean exit.
    # The jobs this worker may have started (protocol.DECLARE_STARTS); NULL: any it holds.
    may_start = JobIdsField(null=True, blank=True)

    class Meta:
        db_table = "conveyor_worker"
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return self.id


API_SCOPES = ("enqueue", "read", "operate", "metrics")


class ApiKey(models.Model):
    """A key for the HTTP API and the metrics view: its secret is stored hashed, never in clear.

    A key reads `cvk_<prefix>_<secret>`. The prefix is public and finds the
    row; only the SHA-256 of the whole key is stored (see `api/keys.py`).
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)  # hex SHA-256 of the whole key.
    scopes = tolerant_json(default=list)
    created_at = InstantField()
    last_used_at = InstantField(null=True, blank=True)
    revoked_at = InstantField(null=True, blank=True)

    class Meta:
        db_table = "conveyor_api_key"
        ordering = ["name", "id"]
        verbose_name = "API key"
        verbose_name_plural = "API keys"
        constraints = [
            # The actor recorded for a key's writes is "api:<name>": one live key per name.
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(revoked_at__isnull=True),
                name="conveyor_api_key_live_name",
            ),
            models.CheckConstraint(
                condition=Q(scopes__contained_by=list(API_SCOPES)),
                name="conveyor_api_key_scopes_known",
            ),
        ]

    def __str__(self) -> str:
        state = "revoked" if self.revoked_at else ", ".join(self.scopes) or "no scopes"
        return f"{self.name} ({self.prefix}, {state})"
