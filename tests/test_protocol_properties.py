"""Property-based test of the real protocol SQL: simulated workers, forced expiry.

A Hypothesis state machine drives the statements of `protocol.py` from three
simulated workers, each on its own connection to the test PostgreSQL, as a
worker's control loop and handler would: claim (and claim an isolated job,
which a reap leaves behind), heartbeat, complete, retry,
fail, snooze, release, reap, the guarded effect (lock, ledger entry and
completion in one transaction, with a reaper racing it) and requeue.
Time is simulated by moving `lease_expires_at` into the past. Workers keep
believing in their leases until a heartbeat or their own write tells them
otherwise, so stale (zombie) writes happen all the time.

After every step the database must equal a small reference model, and the
invariants of DESIGN §4 must hold: one valid token holder per job, outcomes
only from it, one ledger entry per effect-completed job, legal states only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_conveyor import protocol
from django_conveyor.states import JobState
from django_conveyor.worker.connections import connect

WORKERS = ("w0", "w1", "w2")
QUEUE = "default"
LEASE_SECONDS = 30.0
EFFECT_KEY = "effect"
MAX_JOBS = 8
# What a handler's attempt can end in; the effect is context.atomic()'s path.
OUTCOMES = ("effect", "effect_racing_reaper", "complete", "retry", "fail", "release", "snooze")
STATES = frozenset(s.value for s in JobState)
Cursor = psycopg.Cursor[Any]

MACHINE_SETTINGS = settings(
    max_examples=int(os.environ.get("CONVEYOR_PROPERTY_EXAMPLES", "100")),
    stateful_step_count=25,
    deadline=None,
    database=None,  # No example database written into the repository.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

JOBS_SQL = """
SELECT id, state, attempt, max_attempts, lease_owner, lease_version,
       lease_expires_at IS NULL, lease_expires_at < now(), isolated
FROM conveyor_job ORDER BY id
"""
LEDGER_SQL = "SELECT job_id, lease_version, worker FROM conveyor_ledger"
INSERT_LEDGER = """
INSERT INTO conveyor_ledger (job_id, effect_key, lease_version, worker, applied_at)
VALUES (%(job)s, %(key)s, %(version)s, %(worker)s, now())
"""
EXPIRE = """
UPDATE conveyor_job SET lease_expires_at = now() - interval '1 second'
WHERE id = %(id)s AND state = 'running'
"""


@dataclass(slots=True)
class ModelJob:
    """What the database should say about one job."""

    id: int
    max_attempts: int
    state: str = "available"
    attempt: int = 0
    version: int = 0
    owner: str | None = None
    expired: bool = False
    isolated: bool = False  # Reaped back to available: only CLAIM_ISOLATED takes it.
    effects: int = 0  # Ledger entries written by guarded completions.


class ProtocolMachine(RuleBasedStateMachine):
    checked_steps = 0  # Invariant checks run, across all examples.

    def __init__(self) -> None:
        super().__init__()
        self.admin = connect("default", prepare=False)
        # Accidental blocking on a row lock must fail the test, not hang it.
        self.admin.execute("SET lock_timeout = '500ms'")
        self.conns = {w: connect("default", prepare=False) for w in WORKERS}
        for conn in self.conns.values():
            conn.execute("SET lock_timeout = '500ms'")
        self.admin.execute("TRUNCATE conveyor_ledger, conveyor_dependency, conveyor_job")
        self.jobs: dict[int, ModelJob] = {}
        # (job, token) pairs a worker acts on: its control loop's lease plus
        # older attempts whose handlers have not reported yet (zombies).
        self.beliefs: dict[str, set[tuple[int, int]]] = {w: set() for w in WORKERS}
        self.issued: dict[tuple[int, int], str] = {}  # (job, token) -> the claimer

    def teardown(self) -> None:
        for conn in [self.admin, *self.conns.values()]:
            conn.close()

    # -- helpers ----------------------------------------------------------------

    def job_at(self, pick: int) -> ModelJob:
        return self.jobs[sorted(self.jobs)[pick % len(self.jobs)]]

    def believing(self) -> bool:
        return any(self.beliefs.values())

    def belief(self, pick: int, fresh: bool) -> tuple[str, int, int]:
        """One (worker, job, token) some worker is about to act on.

        Unless `fresh`, a stale one if there is any: the zombie writes that
        matter most come first (Hypothesis tries False before True).
        """
        held = sorted((w, job, v) for w in WORKERS for job, v in self.beliefs[w])
        stale = [b for b in held if not self.holds(*b)]
        pool = held if fresh or not stale else stale
        return pool[pick % len(pool)]

    def holds(self, worker: str, job_id: int, version: int) -> bool:
        job = self.jobs[job_id]
        return job.state == "running" and job.owner == worker and job.version == version

    def latest_tokens(self, worker: str) -> dict[int, int]:
        """One token per job, the newest: what the worker's control loop holds."""
        latest: dict[int, int] = {}
        for job_id, version in self.beliefs[worker]:
            latest[job_id] = max(version, latest.get(job_id, 0))
        return latest

    def cursor(self, worker: str) -> Cursor:
        return self.conns[worker].cursor()

    def apply_reap(self, reaped: list[protocol.Reaped], locked: int | None = None) -> None:
        expected = {
            j.id
            for j in self.jobs.values()
            if j.state == "running" and j.expired and j.id != locked
        }
        assert {r.id for r in reaped} == expected, "REAP took back exactly the expired leases"
        for row in reaped:
            job = self.jobs[row.id]
            job.state = "dead" if job.attempt >= job.max_attempts else "available"
            job.isolated = job.state == "available"  # Set exactly when it goes back.
            job.expired = False
            assert row.state == job.state
            assert (row.owner, row.version) == (job.owner, job.version), "REAP names the loser"
            job.owner = None

    # -- setup ----------------------------------------------------------------

    @initialize(
        max_attempts=st.lists(st.integers(1, 3), min_size=1, max_size=4),
        claimers=st.lists(st.sampled_from(WORKERS), max_size=3),
    )
    def start(self, max_attempts: list[int], claimers: list[str]) -> None:
        """Jobs, and first claims: every example starts with work in flight."""
        self.enqueue(max_attempts)
        for worker in claimers:
            self.claim(worker, limit=1)

    @rule(max_attempts=st.integers(1, 3))
    def enqueue_one(self, max_attempts: int) -> None:
        if len(self.jobs) < MAX_JOBS:
            self.enqueue([max_attempts])

    def enqueue(self, max_attempts: list[int]) -> None:
        new = [
            protocol.NewJob(
                task_path="tests.testapp.tasks.noop",
                args=[],
                kwargs={},
                queue=QUEUE,
                backend="default",
                priority=0,
                max_attempts=n,
            )
            for n in max_attempts
        ]
        with self.admin.cursor() as cur:
            done = protocol.enqueue(cur, new, notify=False)
        for row, n in zip(done, max_attempts, strict=True):
            self.jobs[row.id] = ModelJob(row.id, max_attempts=n)

    # -- the worker's statements --------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim(self, worker: str, limit: int) -> None:
        ready = [j for j in self.jobs.values() if j.state == "available" and not j.isolated]
        with self.cursor(worker) as cur:
            leases = protocol.claim(
                cur, owner=worker, queues=[QUEUE], limit=limit, lease_seconds=LEASE_SECONDS
            )
        assert len(leases) == min(limit, len(ready)), "CLAIM takes what is ready, up to the limit"
        assert not any(lease.isolated for lease in leases), "CLAIM never takes an isolated job"
        self.took(worker, leases)

    @rule(worker=st.sampled_from(WORKERS))
    def claim_isolated(self, worker: str) -> None:
        ready = [j for j in self.jobs.values() if j.state == "available" and j.isolated]
        running_one = any(
            j.state == "running" and j.owner == worker and j.isolated for j in self.jobs.values()
        )
        with self.cursor(worker) as cur:
            leases = protocol.claim_isolated(
                cur, owner=worker, queues=[QUEUE], lease_seconds=LEASE_SECONDS
            )
        expected = 0 if running_one else min(1, len(ready))
        assert len(leases) == expected, "CLAIM_ISOLATED takes one, for a worker running none"
        assert all(lease.isolated for lease in leases)
        self.took(worker, leases)

    def took(self, worker: str, leases: list[protocol.Lease]) -> None:
        for lease in leases:
            job = self.jobs[lease.id]
            assert job.state == "available", "CLAIM took a job that was not available"
            assert lease.version == job.version + 1, "every claim issues a new token"
            assert (lease.id, lease.version) not in self.issued
            self.issued[lease.id, lease.version] = worker
            assert lease.attempt == job.attempt + 1
            job.state, job.owner, job.expired = "running", worker, False
            job.version, job.attempt = lease.version, lease.attempt
            self.beliefs[worker].add((lease.id, lease.version))

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        held = sorted(self.latest_tokens(worker).items())
        with self.cursor(worker) as cur:
            renewed = protocol.heartbeat(cur, owner=worker, held=held, lease_seconds=LEASE_SECONDS)
        expected = {job_id for job_id, v in held if self.holds(worker, job_id, v)}
        assert renewed == expected, "HEARTBEAT renews exactly the leases still held"
        for job_id, _ in held:
            if job_id in renewed:
                self.jobs[job_id].expired = False
            else:  # The worker learns it lost the job.
                self.beliefs[worker] = {b for b in self.beliefs[worker] if b[0] != job_id}

    @precondition(lambda self: self.believing())
    @rule(pick=st.integers(0, 50), fresh=st.booleans(), kind=st.sampled_from(OUTCOMES))
    def outcome(self, pick: int, fresh: bool, kind: str) -> None:
        """A handler reports: the worker writes its outcome under the token it holds."""
        self.report(*self.belief(pick, fresh), kind)

    def report(self, worker: str, job_id: int, version: int, kind: str) -> None:
        valid = self.holds(worker, job_id, version)
        if kind.startswith("effect"):
            state = self.effect(worker, job_id, version, valid, race=kind == "effect_racing_reaper")
        else:
            with self.cursor(worker) as cur:
                state = getattr(self, kind)(cur, worker, job_id, version, valid)
        # The worker forgets the attempt once it reported, accepted or not.
        self.beliefs[worker].discard((job_id, version))
        if state is not None:
            job = self.jobs[job_id]
            job.state, job.expired = state, False
            if kind != "release":
                job.isolated = False  # An outcome of the handler ends it; RELEASE keeps it.
            if state != "completed":
                job.owner = None  # A lease that ends clears its owner; COMPLETE keeps it.

    def complete(
        self, cur: Cursor, worker: str, job_id: int, version: int, valid: bool
    ) -> str | None:
        written = protocol.complete(cur, owner=worker, done=[(job_id, version, {"ok": 1})])
        assert (job_id in written) == valid, "COMPLETE is written only by the token holder"
        return "completed" if valid else None

    def retry(self, cur: Cursor, worker: str, job_id: int, version: int, valid: bool) -> str | None:
        error = {"exception_class_path": "builtins.ValueError", "traceback": "boom"}
        written = protocol.retry(cur, owner=worker, failures=[(job_id, version, 0.0, error)])
        assert (job_id in written) == valid, "RETRY is written only by the token holder"
        if valid:
            job = self.jobs[job_id]
            state = "dead" if job.attempt >= job.max_attempts else "available"
            assert written[job_id] == state, "RETRY kills a job whose attempts are used up"
        return written.get(job_id)

    def fail(self, cur: Cursor, worker: str, job_id: int, version: int, valid: bool) -> str | None:
        error = {"exception_class_path": "django_conveyor.exceptions.Discard", "traceback": ""}
        written = protocol.fail(cur, owner=worker, failures=[(job_id, version, error)])
        assert (job_id in written) == valid, "FAIL is written only by the token holder"
        return "failed" if valid else None

    def release(
        self, cur: Cursor, worker: str, job_id: int, version: int, valid: bool
    ) -> str | None:
        written = protocol.release(cur, owner=worker, held=[(job_id, version)])
        return self.handed_back(job_id, written, valid)

    def snooze(
        self, cur: Cursor, worker: str, job_id: int, version: int, valid: bool
    ) -> str | None:
        written = protocol.snooze(cur, owner=worker, snoozed=[(job_id, version, 0.0, None)])
        return self.handed_back(job_id, written, valid)

    def handed_back(self, job_id: int, written: set[int], valid: bool) -> str | None:
        """RELEASE and SNOOZE: back to available, the attempt given back."""
        assert (job_id in written) == valid, "a hand-back is written only by the token holder"
        if valid:
            self.jobs[job_id].attempt -= 1
        return "available" if valid else None

    def effect(
        self, worker: str, job_id: int, version: int, valid: bool, *, race: bool
    ) -> str | None:
        """context.atomic(): lock under the token, write the effect, complete, one commit.

        With `race`, the lease runs out just before the lock is taken, and
        while the row is locked another worker's reaper runs (it must skip the
        job, so the handler cannot lose it between its check and commit) and
        the worker's own loop heartbeats (it must not wait for the lock).
        """
        if race and valid:
            self.admin.execute(EXPIRE, {"id": job_id})
            self.jobs[job_id].expired = True
        conn = self.conns[worker]
        with conn.transaction(), conn.cursor() as cur:
            locked = protocol.lock_for_effect(cur, job_id=job_id, owner=worker, version=version)
            assert locked == valid, "LOCK_FOR_EFFECT succeeds only for the token holder"
            if locked:
                cur.execute(
                    INSERT_LEDGER,
                    {"job": job_id, "key": EFFECT_KEY, "version": version, "worker": worker},
                )
                if race:
                    reaper = WORKERS[(WORKERS.index(worker) + 1) % len(WORKERS)]
                    with self.cursor(reaper) as reap_cur:
                        self.apply_reap(protocol.reap(reap_cur), locked=job_id)
                    self.heartbeat_beside_lock(worker, locked=job_id)
                done = protocol.complete(cur, owner=worker, done=[(job_id, version, None)])
                assert done == {job_id}, "the locked token holder always completes"
        if locked:
            self.jobs[job_id].effects += 1
        return "completed" if locked else None

    def heartbeat_beside_lock(self, worker: str, *, locked: int) -> None:
        """The worker's control loop heartbeats while its handler holds a row lock.

        HEARTBEAT must neither wait for the lock nor renew the locked row; the
        worker's other leases are renewed as usual.
        """
        latest = self.latest_tokens(worker)
        with self.admin.cursor() as cur:  # Stands in for the worker's control connection.
            renewed = protocol.heartbeat(
                cur, owner=worker, held=sorted(latest.items()), lease_seconds=LEASE_SECONDS
            )
        expected = {
            job_id
            for job_id, v in latest.items()
            if job_id != locked and self.holds(worker, job_id, v)
        }
        assert renewed == expected, "HEARTBEAT skips the locked row and renews the rest"
        for job_id in renewed:
            self.jobs[job_id].expired = False

    @rule(worker=st.sampled_from(WORKERS))
    def reap(self, worker: str) -> None:
        with self.cursor(worker) as cur:
            self.apply_reap(protocol.reap(cur))

    # -- time and the operator ---------------------------------------------

    @rule(pick=st.integers(0, 50))
    def expire(self, pick: int) -> None:
        """Let a lease run out (stands in for time passing without a heartbeat)."""
        job = self.job_at(pick)
        self.admin.execute(EXPIRE, {"id": job.id})
        if job.state == "running":
            job.expired = True

    @rule(
        worker=st.sampled_from(WORKERS),
        stay_down=st.booleans(),
        kind=st.sampled_from(OUTCOMES),
    )
    def freeze(self, worker: str, stay_down: bool, kind: str) -> None:
        """The worker stops past its leases (SIGSTOP): they expire, another reaps them.

        It keeps believing in them; its later writes are the zombie's. Unless
        `stay_down`, it wakes, claims again (possibly the same jobs under new
        tokens: same owner, older token) and one of its old handlers reports.
        """
        for job in self.jobs.values():
            if job.state == "running" and job.owner == worker:
                self.admin.execute(EXPIRE, {"id": job.id})
                job.expired = True
        reaper = WORKERS[(WORKERS.index(worker) + 1) % len(WORKERS)]
        with self.cursor(reaper) as cur:
            self.apply_reap(protocol.reap(cur))
        if not stay_down:
            self.claim(worker, limit=len(self.jobs))
            stale = sorted(b for b in self.beliefs[worker] if not self.holds(worker, *b))
            if stale:
                self.report(worker, *stale[0], kind)

    @rule(pick=st.integers(0, 50))
    def requeue(self, pick: int) -> None:
        job = self.job_at(pick)
        with self.admin.cursor() as cur:
            done = protocol.requeue(cur, ids=[job.id], notify=False)
        requeueable = job.state in ("failed", "dead", "cancelled")
        assert (job.id in done) == requeueable
        if requeueable:
            job.state, job.attempt, job.isolated = "available", 0, False

    # -- invariants -----------------------------------------------------------

    def rows(self) -> dict[int, tuple[Any, ...]]:
        return {row[0]: row for row in self.admin.execute(JOBS_SQL).fetchall()}

    @invariant()
    def database_matches_model(self) -> None:
        rows = self.rows()
        assert set(rows) == set(self.jobs)
        for job_id, (
            _,
            state,
            attempt,
            max_attempts,
            owner,
            version,
            no_lease,
            expired,
            isolated,
        ) in rows.items():
            job = self.jobs[job_id]
            assert (state, attempt, owner, version, isolated) == (
                job.state,
                job.attempt,
                job.owner,
                job.version,
                job.isolated,
            ), f"job {job_id}: database and model disagree"
            assert state in STATES, f"job {job_id} is in an unknown state {state!r}"
            assert no_lease == (state != "running"), "only a running job carries a lease"
            if state == "running":
                assert bool(expired) == job.expired
                assert 1 <= attempt <= max_attempts, "a running attempt is within max_attempts"
            assert attempt >= 0

    @invariant()
    def one_token_holder(self) -> None:
        rows = self.rows()
        for job_id, row in rows.items():
            state, owner, version = row[1], row[4], row[5]
            agreed = [
                w
                for w in WORKERS
                if (job_id, version) in self.beliefs[w] and state == "running" and owner == w
            ]
            assert len(agreed) <= 1, f"job {job_id}: two workers hold a valid lease"
            if owner is not None:
                assert self.issued[job_id, version] == owner, "the owner holds the current token"
            for worker in WORKERS:
                for held_job, believed in self.beliefs[worker]:
                    if held_job != job_id:
                        continue
                    assert believed <= version, "no worker holds a token newer than the job's"
                    assert self.issued[job_id, believed] == worker, "a token has one holder"

    @invariant()
    def effects_exactly_once(self) -> None:
        type(self).checked_steps += 1
        rows = self.rows()
        entries: dict[int, list[tuple[int, str]]] = {}
        for job_id, version, worker in self.admin.execute(LEDGER_SQL).fetchall():
            entries.setdefault(job_id, []).append((version, worker))
        for job_id, job in self.jobs.items():
            mine = entries.get(job_id, [])
            assert len(mine) == job.effects <= 1, f"job {job_id}: effect applied {len(mine)} times"
            if mine:
                state, owner, version = rows[job_id][1], rows[job_id][4], rows[job_id][5]
                assert state == "completed", "an effect commits only with its completion"
                assert mine[0] == (version, owner), "the effect carries the completing token"


@pytest.mark.django_db(transaction=True)
def test_protocol_state_machine() -> None:
    ProtocolMachine.checked_steps = 0
    run_state_machine_as_test(ProtocolMachine, settings=MACHINE_SETTINGS)
    # The invariants above assert after every step; make sure steps ran at all.
    assert ProtocolMachine.checked_steps > 100, "the state machine checked too few steps"
