"""enqueue_many() of more plain calls than one piece: ENQUEUE per piece, all sent in
one pipeline, in one transaction (a savepoint in the caller's): every call in
order, one notification on commit, and all or nothing when a call or a
statement fails in a later piece."""

import gc

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from django_conveyor import protocol
from django_conveyor.compat import task_backends
from django_conveyor.exceptions import ArgumentsNotSerializable
from django_conveyor.models import Job
from django_conveyor.worker.connections import connect
from tests.helpers import direct_dsn
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

PIECE = protocol.ENQUEUE_PIECE
CALLS = 2 * PIECE + 345  # Three pieces, the last one short.


def calls(n: int = CALLS) -> list[tuple[tuple[int, int], dict]]:
    return [((i, -i), {}) for i in range(n)]


def enqueue_statements(queries: CaptureQueriesContext) -> int:
    return sum("INSERT INTO conveyor_job" in q["sql"] for q in queries.captured_queries)


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
