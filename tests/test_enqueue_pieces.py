"""enqueue_many() of more calls than one piece: ENQUEUE per piece, all sent in one
pipeline, in one transaction (a savepoint in the caller's): every call in
order, one notification on commit, and all or nothing when a call or a
statement fails in a later piece. Calls of a unique task that skips its
duplicates are folded as they come, and answered as one statement answers."""

import gc
import threading
from unittest import mock

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from django_conveyor import protocol
from django_conveyor.compat import task_backends
from django_conveyor.exceptions import ArgumentsNotSerializable
from django_conveyor.models import Job
from django_conveyor.signals import task_enqueue_replayed
from django_conveyor.worker.connections import connect
from tests.helpers import direct_dsn, wait_until, waiting_backends
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

PIECE = protocol.ENQUEUE_PIECE
CALLS = 2 * PIECE + 345  # Three pieces, the last one short.


def calls(n: int = CALLS) -> list[tuple[tuple[int, int], dict]]:
    return [((i, -i), {}) for i in range(n)]


def enqueue_statements(queries: CaptureQueriesContext) -> int:
    return sum("INSERT INTO conveyor_job" in q["sql"] for q in queries.captured_queries)


def statements(queries: CaptureQueriesContext) -> int:
    """Statements other than the transaction's own (BEGIN, SAVEPOINT, COMMIT...)."""
    own = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")
    return sum(not q["sql"].startswith(own) for q in queries.captured_queries)


@pytest.fixture
def listener():
    with connect("default", dsn=direct_dsn()) as conn:  # LISTEN needs a direct connection
        conn.execute("LISTEN conveyor")
        yield conn


@pytest.fixture
def refuse_arg():
    """A trigger that refuses a job whose first argument is -1 (a statement that fails)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """CREATE FUNCTION refuse_arg() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused by the trigger: %', NEW.args; END $$;
            CREATE TRIGGER refuse_arg BEFORE INSERT ON conveyor_job FOR EACH ROW
            WHEN (NEW.args -> 0 = '-1'::jsonb) EXECUTE FUNCTION refuse_arg()"""
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER refuse_arg ON conveyor_job; DROP FUNCTION refuse_arg()")


class TestInPieces:
    def test_every_call_in_order_one_statement_per_piece(self):
        with CaptureQueriesContext(connection) as queries:
            results = tasks.add.enqueue_many(calls())
        assert enqueue_statements(queries) == 3
        ids = [int(r.id) for r in results]
        assert ids == sorted(ids) and len(set(ids)) == CALLS
        rows = dict(Job.objects.values_list("id", "args"))
        assert [rows[i] for i in ids] == [[i, -i] for i in range(CALLS)]
        assert [r.args for r in results] == [[i, -i] for i in range(CALLS)]
        assert {(r.state, r.created) for r in results} == {("available", True)}
        assert len({r.enqueued_at for r in results}) == 1  # One transaction, one now().
        assert Job.objects.filter(state="available").count() == CALLS

    def test_up_to_one_piece_is_one_statement(self):
        with CaptureQueriesContext(connection) as queries:
            tasks.add.enqueue_many(calls(PIECE))
        assert enqueue_statements(queries) == 1
        assert Job.objects.count() == PIECE

    def test_calls_with_options_are_one_statement(self):
        batch = [*calls(), ((0, 0), {}, {"idempotency_key": "one"})]
        with CaptureQueriesContext(connection) as queries:
            results = tasks.add.enqueue_many(batch)
        assert enqueue_statements(queries) == 1
        assert len(results) == CALLS + 1 and Job.objects.count() == CALLS + 1

    def test_calls_with_options_of_none_are_plain(self):
        with CaptureQueriesContext(connection) as queries:
            tasks.add.enqueue_many([(args, kwargs, None) for args, kwargs in calls()])
        assert enqueue_statements(queries) == 3
        assert Job.objects.count() == CALLS

    def test_one_notification_on_commit(self, listener):
        with transaction.atomic():
            tasks.add.enqueue_many(calls())
            assert list(listener.notifies(timeout=0.3)) == []  # Not before commit.
        notes = list(listener.notifies(timeout=2.0, stop_after=2))
        assert [(n.channel, n.payload) for n in notes] == [("conveyor", "default")]

    def test_rolled_back_with_the_callers_transaction(self, listener):
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue_many(calls())
            raise RuntimeError("the caller changes its mind")
        assert Job.objects.count() == 0
        assert list(listener.notifies(timeout=0.5)) == []


class TestAllOrNothing:
    def test_a_bad_call_in_the_last_piece_leaves_nothing(self):
        batch = calls()
        batch[CALLS - 3] = ((object(), 1), {})
        with pytest.raises(ArgumentsNotSerializable, match=r"add\(\) args\[0\]"):
            tasks.add.enqueue_many(batch)
        assert Job.objects.count() == 0

    def test_the_callers_transaction_goes_on_after_a_bad_call(self):
        batch = calls()
        batch[PIECE + 7] = (("\x00", 1), {})
        with transaction.atomic():
            Effect.objects.create(job_id=0, token=0, worker="", label="caller's own row")
            with pytest.raises(ArgumentsNotSerializable, match="NUL character"):
                tasks.add.enqueue_many(batch)
            assert Job.objects.count() == 0
            tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1
        assert Effect.objects.count() == 1

    def test_a_statement_failing_in_a_later_piece_leaves_nothing(self, refuse_arg):
        batch = calls()
        batch[2 * PIECE + 11] = ((-1, 0), {})
        with pytest.raises(DatabaseError, match="refused by the trigger"):
            tasks.add.enqueue_many(batch)
        assert Job.objects.count() == 0
        result = tasks.add.enqueue(3, 4)  # The connection is usable again.
        assert Job.objects.get().pk == int(result.id)

    def test_inside_the_callers_transaction_a_failed_statement_is_rolled_back_alone(
        self, refuse_arg
    ):
        batch = calls()
        batch[PIECE + 1] = ((-1, 0), {})
        with transaction.atomic():
            Effect.objects.create(job_id=0, token=0, worker="", label="caller's own row")
            with pytest.raises(DatabaseError, match="refused by the trigger"):
                tasks.add.enqueue_many(batch)
            tasks.add.enqueue(1, 2)
        assert list(Job.objects.values_list("args", flat=True)) == [[1, 2]]
        assert Effect.objects.count() == 1

    def test_the_pieces_refuse_a_job_a_key_or_a_dependency_could_change(self):
        backend = task_backends["default"]
        plain = backend.new_job(tasks.add, (1, 2), {})
        keyed = backend.new_job(tasks.add.using(idempotency_key="k"), (3, 4), {})
        with pytest.raises(ValueError, match="plain jobs only"), transaction.atomic():
            connection.ensure_connection()
            protocol.enqueue_pieces(
                connection.connection, connection.cursor, [[plain], [keyed]], notify=False
            )
        assert Job.objects.count() == 0


class TestCollector:
    def test_left_on_after_a_batch(self):
        assert gc.isenabled()
        tasks.add.enqueue_many(calls())
        assert gc.isenabled()

    def test_left_on_after_a_batch_that_failed(self):
        with pytest.raises(ArgumentsNotSerializable):
            tasks.add.enqueue_many([*calls(10), ((object(), 1), {})])
        assert gc.isenabled()

    def test_not_turned_on_when_it_was_off(self):
        gc.disable()
        try:
            tasks.add.enqueue_many(calls(10))
            assert not gc.isenabled()
        finally:
            gc.enable()


def shape(results) -> list[tuple[bool, int]]:
    """Each call's created flag and the first call (or -1 - the holder) of its job."""
    first: dict[str, int] = {}
    return [(r.created, first.setdefault(r.id, i)) for i, r in enumerate(results)]


class TestUniqueInPieces:
    def test_folded_as_they_come_and_the_held_keys_read_once(self):
        held = [tasks.unique_add.enqueue(i, 0) for i in range(50)]
        gone = tasks.unique_add.enqueue(PIECE, 0)  # Its job no longer holds the key.
        Job.objects.filter(pk=gone.id).update(state="completed")
        batch = [((i, 0), {}) for i in range(CALLS)]
        batch += [((i, 0), {}) for i in range(PIECE - 5, PIECE + 5)]  # Across two pieces.
        batch += [((i, 0), {}) for i in range(3)]  # Of jobs in the table.
        with CaptureQueriesContext(connection) as queries:
            results = tasks.unique_add.enqueue_many(batch)
        assert enqueue_statements(queries) == 3  # One per piece with new keys.
        assert statements(queries) == 4  # And one read of the keys held in the table.
        assert [r.created for r in results] == [False] * 50 + [True] * (CALLS - 50) + [False] * 13
        assert [r.id for r in results[:50]] == [h.id for h in held]
        assert results[PIECE].id != gone.id
        tail = results[CALLS:]
        assert [r.id for r in tail[:10]] == [r.id for r in results[PIECE - 5 : PIECE + 5]]
        assert [r.id for r in tail[10:]] == [h.id for h in held[:3]]
        assert all(r.args == list(call[0]) for r, call in zip(results, batch, strict=True))
        assert Job.objects.count() == 51 + CALLS - 50
        assert Job.objects.filter(state="available").count() == CALLS

    @given(
        held=st.lists(st.integers(0, 40), max_size=15, unique=True),
        keys=st.lists(st.integers(0, 60), min_size=1, max_size=60),
    )
    @settings(max_examples=40, deadline=None)
    def test_answered_as_one_statement_answers(self, held, keys):
        def run(piece: int) -> list[tuple[bool, int]]:
            holders = {tasks.unique_add.enqueue(k, 0).id: k for k in held}
            with mock.patch.object(protocol, "ENQUEUE_PIECE", piece):
                results = tasks.unique_add.enqueue_many([((k, 0), {}) for k in keys])
            Job.objects.all().delete()
            return [
                (created, -1 - holders[r.id] if r.id in holders else first)
                for (created, first), r in zip(shape(results), results, strict=True)
            ]

        assert run(7) == run(10**6)

    def test_a_task_that_replaces_is_one_statement(self):
        batch = [((i,), {"note": "n"}) for i in range(CALLS)]
        with CaptureQueriesContext(connection) as queries:
            results = tasks.debounced.enqueue_many(batch)
        assert enqueue_statements(queries) == 1
        assert all(r.created for r in results) and Job.objects.count() == CALLS

    def test_a_bad_call_in_the_last_piece_leaves_nothing(self):
        tasks.unique_add.enqueue(0, 0)
        batch = [*calls(CALLS - 1), ((object(), 1), {})]
        with pytest.raises(ArgumentsNotSerializable, match=r"unique_add\(\) args\[0\]"):
            tasks.unique_add.enqueue_many(batch)
        assert Job.objects.count() == 1

    def test_each_folded_call_is_announced_as_replayed(self):
        replayed = []

        def heard(sender, task_result, **kwargs):
            replayed.append(task_result.id)

        tasks.unique_add.enqueue(7, -7)
        task_enqueue_replayed.connect(heard)
        try:
            results = tasks.unique_add.enqueue_many([*calls(), ((8, -8), {})])
        finally:
            task_enqueue_replayed.disconnect(heard)
        assert replayed == [results[7].id, results[8].id]

    def test_the_pieces_refuse_a_job_whose_later_calls_could_change_it(self):
        backend = task_backends["default"]
        skipping = backend.new_job(tasks.unique_add, (1, 2), {})
        replacing = backend.new_job(tasks.debounced, (3,), {})
        plain = backend.new_job(tasks.add, (1, 2), {})
        for refused in (replacing, plain):
            with (
                pytest.raises(ValueError, match="skipping unique jobs only"),
                transaction.atomic(),
            ):
                connection.ensure_connection()
                protocol.enqueue_unique_pieces(
                    connection.connection, connection.cursor, [[skipping], [refused]], notify=False
                )
        assert Job.objects.count() == 0

    def test_a_concurrent_batch_of_the_same_keys_waits_and_gets_its_jobs(self):
        inserted, release = threading.Event(), threading.Event()
        outcome: dict[str, list] = {}

        def first() -> None:
            try:
                with transaction.atomic():
                    outcome["first"] = tasks.unique_add.enqueue_many(calls())
                    inserted.set()
                    release.wait(timeout=30)
            finally:
                connections.close_all()

        def second() -> None:
            try:
                outcome["second"] = tasks.unique_add.enqueue_many(calls(CALLS + 100))
            finally:
                connections.close_all()

        one, two = threading.Thread(target=first), threading.Thread(target=second)
        one.start()
        assert inserted.wait(timeout=30)
        two.start()
        wait_until(lambda: "second" in outcome or waiting_backends() >= 1)
        assert "second" not in outcome  # It waits for the first transaction's keys.
        release.set()
        one.join(timeout=60)
        two.join(timeout=60)
        first_ids = [r.id for r in outcome["first"]]
        second = outcome["second"]
        assert [r.id for r in second[:CALLS]] == first_ids
        assert [r.created for r in second] == [False] * CALLS + [True] * 100
        assert Job.objects.count() == CALLS + 100
