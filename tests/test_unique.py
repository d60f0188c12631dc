"""Unique jobs: the option, keys, skip, replace, the index, bulk, requeue (docs/unique-jobs.md)."""

import datetime as dt
import hashlib
import io
import json
import threading
from collections import Counter

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import given, settings
from hypothesis import strategies as st

from django_conveyor import Unique, operations, protocol
from django_conveyor.compat import InvalidTask
from django_conveyor.exceptions import IdempotencyKeyReused
from django_conveyor.models import Job
from django_conveyor.serialization import loaded
from django_conveyor.tasks import task
from django_conveyor.unique import OPTIONAL_STATES, PARTS, unique_call
from django_conveyor.worker.connections import connect
from tests.helpers import direct_dsn, run_burst, wait_until, waiting_backends
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)
UNFINISHED = ("blocked", "available", "running")
# What a call's arguments may hold after their JSON round trip (no NUL, no lone surrogate).
TEXTS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6
)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXTS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXTS, inner, max_size=3),
    max_leaves=8,
)


def whole_object(unique, *, task_name, task_path, args, kwargs, queue) -> str:
    """What a call's key hashes, encoded as one object (the key's definition)."""
    material = {"task": task_path, "period": unique.seconds, "states": unique.states}
    if "args" in unique.parts:
        material["args"] = args
    if "kwargs" in unique.parts:
        material["kwargs"] = kwargs
    if "queue" in unique.parts:
        material["queue"] = queue
    if unique.key_function is not None:
        material["key"] = unique.key_function(*args, **kwargs)
    return json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def account_of(*args, **kwargs):
    """A key function: the account a call is for (its first argument), as an object."""
    return {"z": args[0] if args else None, "é": [1.5, None]}


def keyed(key: str) -> list[Job]:
    return list(Job.objects.filter(unique_key=key).order_by("id"))


def claim_all(cur) -> list[protocol.Lease]:
    return protocol.claim(cur, owner="w1", queues=["default"], limit=100, lease_seconds=30)


def run_in_threads(target, count: int) -> None:
    """Run `target` in `count` threads at once and wait for them all."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class TestTheOption:
    def test_importable_from_the_package(self):
        assert Unique().on_duplicate == "skip"
        assert Unique().states == UNFINISHED
        assert Unique().parts == ("task", "args", "kwargs", "queue")

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"by": ["args", "kwarg"]}, "Unique\\(by=...\\) takes .* or a callable, not 'kwarg'"),
            ({"by": [len, abs]}, "Unique\\(by=...\\) takes at most one callable"),
            ({"by": []}, "Unique\\(by=...\\) names nothing"),
            ({"by": 5}, "Unique\\(by=...\\) takes part names"),
            ({"period": 0}, "Unique\\(period=...\\) must be a whole number of seconds from 1"),
            ({"period": -5}, "not -5"),
            ({"period": 1.5}, "not 1.5"),
            ({"period": "60"}, "not '60'"),
            ({"period": True}, "not True"),
            ({"period": float("nan")}, "not nan"),
            ({"period": 10 * 365 * 86400 + 1}, "to 315360000"),
            ({"period": dt.timedelta(milliseconds=1500)}, "timedelta of whole seconds"),
            ({"states": ["available"]}, "missing: blocked, running"),
            ({"states": [*UNFINISHED, "done"]}, "names no job state 'done'"),
            ({"states": 3}, "takes state names"),
            ({"on_duplicate": "update"}, "must be 'skip' or 'replace', not 'update'"),
        ],
    )
    def test_a_bad_option_is_refused_where_it_is_built(self, options, message):
        with pytest.raises(InvalidTask, match=message):
            Unique(**options)

    def test_good_options_are_normalised(self):
        unique = Unique(
            by="kwargs", period=dt.timedelta(days=1), states=[*UNFINISHED, "completed", "dead"]
        )
        assert unique.parts == ("task", "kwargs")
        assert unique.seconds == 86400
        assert unique.states == (*UNFINISHED, "completed", "dead")
        assert Unique(period=60.0).seconds == 60

    def test_the_task_option_must_be_a_unique(self):
        with pytest.raises(InvalidTask, match=r"unique must be a Unique\(...\).*not dict"):
            task(unique={"period": 60})(tasks.noop.func)

        with pytest.raises(InvalidTask, match="not str"):
            tasks.add.using(unique="yes")

    def test_using_sets_or_clears_it_per_call(self):
        assert tasks.add.using(unique=Unique(period=5)).unique.seconds == 5
        assert tasks.unique_add.using(unique=False).unique is None
        assert tasks.unique_add.using(unique=None).unique is tasks.unique_add.unique

    def test_a_unique_job_cannot_wait_for_dependencies(self):
        first = tasks.add.enqueue(1, 1)
        with pytest.raises(InvalidTask, match="A unique job cannot wait for dependencies"):
            tasks.unique_add.using(depends_on=[first]).enqueue(1, 2)
        assert Job.objects.count() == 1


class TestInAWorkflow:
    def test_a_unique_step_may_start_a_workflow_but_not_wait_in_one(self):
        from django_conveyor.workflows import chain

        started = chain(tasks.unique_add.step(1, 2), tasks.add.step(3, 4)).enqueue()
        assert len(started.results) == 2 and Job.objects.count() == 2
        with pytest.raises(
            InvalidTask, match=r"unique_add\(\) has unique=.*\.using\(unique=False\)"
        ):
            chain(tasks.add.step(5, 6), tasks.unique_add.step(7, 8)).enqueue()
        assert Job.objects.count() == 2  # The whole workflow is refused.
        chain(tasks.add.step(5, 6), tasks.unique_add.using(unique=False).step(7, 8)).enqueue()
        assert Job.objects.count() == 4


class TestTheKey:
    def test_what_by_names_makes_the_key(self):
        a = tasks.unique_add.enqueue(1, 2)
        b = tasks.unique_add.enqueue(1, 3)
        c = tasks.unique_add.using(queue_name="emails").enqueue(1, 2)
        d = tasks.unique_add.using(unique=Unique(by=["args"])).enqueue(1, 2)
        e = tasks.unique_add.using(unique=Unique(by=["args"])).enqueue(1, 2)
        assert all(r.created for r in (a, b, c, d))
        assert e.created is False and e.id == d.id
        assert len({job.unique_key for job in Job.objects.all()}) == 4

    def test_a_callable_picks_the_part_that_matters(self):
        first = tasks.debounced.enqueue(42, note="a")
        other_account = tasks.debounced.enqueue(43, note="a")
        same_account = tasks.debounced.enqueue(42, note="b")
        assert same_account.created is False and same_account.id == first.id
        assert other_account.created is True
        job = Job.objects.get(pk=first.id)
        assert job.uniqueness["key"] == 42
        assert job.uniqueness["by"][0] == "task"
        assert job.uniqueness["by"][1].endswith("tests.testapp.tasks.<lambda>")
        assert job.uniqueness["on_duplicate"] == "replace"
        assert job.unique_states == list(UNFINISHED)
        assert len(job.unique_key) == 64

    def test_a_callable_that_raises_or_returns_no_json_writes_nothing(self):
        with pytest.raises(InvalidTask, match=r"Unique\(by=.*\) of debounced\(\) raised TypeError"):
            tasks.debounced.enqueue()
        odd = Unique(by=lambda *args, **kwargs: object())
        with pytest.raises(InvalidTask, match=r"of add\(\) returned is not JSON-serializable"):
            tasks.add.using(unique=odd).enqueue(1, 2)
        assert Job.objects.count() == 0

    @pytest.mark.parametrize(
        "unique, args, kwargs, queue, key",
        [
            (Unique(), [1, 2], {}, "default",
             "1c8a914f8622ecf744307cf8203e77f950341f3cb4be937f946d4facae109d30"),
            (Unique(by=["kwargs"]), [1, 2], {"x": "ü"}, "default",
             "f9f3b16d81d402d74c4f47a5e6f0a960449a77b23d4c71ea77cd2142ef715891"),
            (Unique(by=[*PARTS, account_of], period=3600,
                    states=[*UNFINISHED, "completed"], on_duplicate="replace"),
             [1, "é\"'", {"b": 1, "a": [2.5, None]}], {"z": 1, "to": "a@b"}, "emails",
             "2936977d5647db62d92e38688b5949c4c4e90488811a5ae3639e370f767d3817"),
        ],
    )  # fmt: skip
    def test_a_key_is_the_same_as_in_the_release_before(self, unique, args, kwargs, queue, key):
        """A changed key would let a duplicate in beside a job enqueued before an upgrade."""
        call = unique_call(unique, task_name="add", task_path="tests.testapp.tasks.add",
                           args=args, kwargs=kwargs, queue=queue)  # fmt: skip
        assert call.key == key

    @given(
        args=st.lists(JSON_VALUES, max_size=4),
        kwargs=st.dictionaries(TEXTS, JSON_VALUES, max_size=4),
        by=st.lists(st.sampled_from(["args", "kwargs", "queue"]), unique=True),
        keyed=st.booleans(),
        period=st.none() | st.integers(1, 10**6),
        states=st.lists(st.sampled_from(OPTIONAL_STATES), unique=True),
        queue=TEXTS.filter(bool),
    )
    @settings(max_examples=300, deadline=None)
    def test_a_key_is_the_hash_of_its_parts_as_one_object(
        self, args, kwargs, by, keyed, period, states, queue
    ):
        unique = Unique(by=["task", *by, account_of] if keyed else ["task", *by], period=period,
                        states=[*UNFINISHED, *states])  # fmt: skip
        parts = {"unique": unique, "task_name": "add", "task_path": "tests.testapp.tasks.add",
                 "args": args, "kwargs": kwargs, "queue": queue}  # fmt: skip
        material = whole_object(**parts)
        assert unique_call(**parts).key == hashlib.sha256(material.encode()).hexdigest()
        assert json.loads(material)["task"] == "tests.testapp.tasks.add"

    def test_period_and_states_are_part_of_the_key(self):
        plain = tasks.add.using(unique=Unique()).enqueue(1, 2)
        hourly = tasks.add.using(unique=Unique(period=3600)).enqueue(1, 2)
        kept = tasks.add.using(unique=Unique(states=[*UNFINISHED, "completed"])).enqueue(1, 2)
        assert plain.created and hourly.created and kept.created

    def test_the_window_comes_from_the_database_clock(self, cur):
        result = tasks.add.using(unique=Unique(period=3600)).enqueue(1, 2)
        cur.execute(
            "SELECT to_timestamp(floor(extract(epoch FROM enqueued_at) / 3600) * 3600) "
            "FROM conveyor_job WHERE id = %s",
            [int(result.id)],
        )
        (expected,) = cur.fetchone()
        job = Job.objects.get(pk=result.id)
        assert job.unique_window == expected
        assert job.unique_window.timestamp() % 3600 == 0
        assert job.uniqueness["period"] == 3600
        assert Job.objects.get(pk=tasks.unique_add.enqueue(1, 2).id).unique_window is None


class TestSkip:
    def test_a_duplicate_returns_the_job_holding_the_key(self):
        first = tasks.unique_add.enqueue(1, 2)
        second = tasks.unique_add.enqueue(1, 2)
        assert first.created is True
        assert (second.created, second.replaced) == (False, False)
        assert second.id == first.id and second.args == [1, 2] and second.state == "available"
        assert Job.objects.count() == 1

    def test_a_duplicate_sends_the_replayed_signal(self):
        from django_conveyor.signals import task_enqueue_replayed

        heard = []

        def receiver(sender, task_result, **kwargs):
            heard.append(task_result.id)

        task_enqueue_replayed.connect(receiver)
        try:
            first = tasks.unique_add.enqueue(1, 2)
            tasks.unique_add.enqueue(1, 2)
        finally:
            task_enqueue_replayed.disconnect(receiver)
        assert heard == [first.id]

    def test_a_running_job_still_holds_the_key(self, cur):
        first = tasks.unique_add.enqueue(1, 2)
        claim_all(cur)
        again = tasks.unique_add.enqueue(1, 2)
        assert (again.created, again.id, again.state) == (False, first.id, "running")

    def test_a_completed_job_frees_the_key(self):
        first = tasks.unique_add.enqueue(1, 2)
        run_burst()
        assert Job.objects.get(pk=first.id).state == "completed"
        again = tasks.unique_add.enqueue(1, 2)
        assert again.created is True and again.id != first.id

    @pytest.mark.parametrize("end", ["fail", "dead", "cancel"])
    def test_every_other_end_frees_the_key(self, cur, end):
        first = tasks.unique_add.using(max_attempts=1).enqueue(1, 2)
        if end == "cancel":
            assert protocol.cancel(cur, ids=[int(first.id)]) == [int(first.id)]
        else:
            (lease,) = claim_all(cur)
            error = {"exception_class_path": "builtins.ValueError", "traceback": ""}
            if end == "fail":
                protocol.fail(cur, owner="w1", failures=[(lease.id, lease.version, error)])
            else:
                protocol.retry(cur, owner="w1", failures=[(lease.id, lease.version, 0, error)])
        assert Job.objects.get(pk=first.id).state in ("failed", "dead", "cancelled")
        assert tasks.unique_add.enqueue(1, 2).created is True

    def test_with_completed_in_its_states_the_key_stays_until_pruned(self, cur):
        first = tasks.once_a_second.using(unique=Unique(states=[*UNFINISHED, "completed"])).enqueue(
            "x"
        )
        run_burst()
        again = tasks.once_a_second.using(unique=Unique(states=[*UNFINISHED, "completed"])).enqueue(
            "x"
        )
        assert (again.created, again.id, again.state) == (False, first.id, "completed")
        assert protocol.prune(cur, older_than_seconds=0, queues=["default"], limit=10) == 1
        third = tasks.once_a_second.using(unique=Unique(states=[*UNFINISHED, "completed"])).enqueue(
            "x"
        )
        assert third.created is True

    def test_a_later_window_is_a_new_job(self, cur):
        hourly = tasks.add.using(unique=Unique(period=3600))
        first = hourly.enqueue(1, 2)
        assert hourly.enqueue(1, 2).id == first.id
        # As if the first had been enqueued an hour ago: its window is over.
        cur.execute("UPDATE conveyor_job SET unique_window = unique_window - interval '1 hour'")
        second = hourly.enqueue(1, 2)
        assert second.created is True
        assert len({job.unique_window for job in Job.objects.all()}) == 2

    def test_unique_false_makes_a_new_job_anyway(self):
        first = tasks.unique_add.enqueue(1, 2)
        other = tasks.unique_add.using(unique=False).enqueue(1, 2)
        assert other.created is True and other.id != first.id
        assert Job.objects.get(pk=other.id).unique_key is None

    def test_a_rolled_back_enqueue_frees_the_key(self):
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.unique_add.enqueue(1, 2)
            raise RuntimeError
        assert Job.objects.count() == 0
        assert tasks.unique_add.enqueue(1, 2).created is True


class TestWithIdempotencyKeys:
    def test_the_idempotency_key_is_checked_first(self):
        keyed_job = tasks.unique_add.using(idempotency_key="k1").enqueue(1, 2)
        run_burst()  # Completed: its unique key is free again.
        holder = tasks.unique_add.enqueue(1, 2)
        assert holder.created is True
        # A retry of the first request gets the first job, not the holder.
        retry = tasks.unique_add.using(idempotency_key="k1").enqueue(1, 2)
        assert (retry.created, retry.id, retry.state) == (False, keyed_job.id, "completed")

    def test_a_reused_idempotency_key_is_still_refused(self):
        tasks.unique_add.using(idempotency_key="k1").enqueue(1, 2)
        with pytest.raises(IdempotencyKeyReused, match="differs in its arguments"):
            tasks.unique_add.using(idempotency_key="k1").enqueue(5, 5)

    def test_a_call_folded_by_its_unique_key_does_not_store_its_idempotency_key(self):
        holder = tasks.unique_add.enqueue(1, 2)
        folded = tasks.unique_add.using(idempotency_key="k2").enqueue(1, 2)
        assert (folded.created, folded.id) == (False, holder.id)
        assert not Job.objects.filter(idempotency_key="k2").exists()


class TestReplace:
    def test_a_job_not_started_takes_the_new_arguments_and_run_after(self):
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        first = tasks.debounced.enqueue(42, note="a")
        second = tasks.debounced.using(run_after=later).enqueue(42, note="b")
        third = tasks.debounced.using(run_after=later + dt.timedelta(seconds=5)).enqueue(
            42, note="c"
        )
        assert [r.created for r in (first, second, third)] == [True, False, False]
        assert [r.replaced for r in (first, second, third)] == [False, True, True]
        job = Job.objects.get(pk=first.id)
        assert job.kwargs == {"note": "c"}
        assert job.run_after == later + dt.timedelta(seconds=5)
        assert job.enqueued_run_after == job.run_after
        assert job.uniqueness["replaced"] == 2
        assert third.kwargs == {"note": "c"}
        assert Job.objects.count() == 1

    def test_a_running_job_is_left_alone_and_no_job_is_created(self, cur):
        first = tasks.debounced.enqueue(42, note="a")
        claim_all(cur)
        again = tasks.debounced.enqueue(42, note="b")
        assert (again.created, again.replaced, again.id, again.state) == (
            False,
            False,
            first.id,
            "running",
        )
        job = Job.objects.get(pk=first.id)
        assert job.kwargs == {"note": "a"} and "replaced" not in job.uniqueness
        assert Job.objects.count() == 1

    def test_a_finished_job_no_longer_holds_the_key(self):
        first = tasks.debounced.enqueue(42, note="a")
        run_burst()
        again = tasks.debounced.enqueue(42, note="b")
        assert again.created is True and again.id != first.id

    def test_a_claim_that_commits_while_the_replace_waits_wins(self):
        """The replace is guarded by state under the row lock: a claim committed
        between the insert meeting the key and the update leaves the job alone."""
        first = tasks.debounced.enqueue(42, note="a")
        with connect("default", dsn=direct_dsn()) as claimer:
            claimer.execute("BEGIN")
            protocol.claim(
                claimer.cursor(), owner="w1", queues=["default"], limit=1, lease_seconds=30
            )
            outcome = {}

            def replace():
                try:
                    outcome["result"] = tasks.debounced.enqueue(42, note="b")
                finally:
                    connections.close_all()

            thread = threading.Thread(target=replace)
            thread.start()
            wait_until(lambda: waiting_backends() >= 1)  # The UPDATE waits for the claim.
            claimer.execute("COMMIT")
            thread.join(timeout=30)
        result = outcome["result"]
        assert (result.created, result.replaced, result.id, result.state) == (
            False,
            False,
            first.id,
            "running",
        )
        assert Job.objects.get(pk=first.id).kwargs == {"note": "a"}
        assert Job.objects.count() == 1

    def test_the_replaced_job_is_not_claimed_before_the_caller_commits(self, cur):
        tasks.debounced.enqueue(42, note="a")
        with transaction.atomic():
            tasks.debounced.enqueue(42, note="b")
            with connect("default", dsn=direct_dsn()) as worker:
                leases = protocol.claim(
                    worker.cursor(), owner="w1", queues=["default"], limit=1, lease_seconds=30
                )
        assert leases == []  # CLAIM skips the row the replace holds locked.
        (lease,) = claim_all(cur)
        assert loaded(lease.kwargs) == {"note": "b"}


class TestConcurrency:
    def test_sixteen_threads_of_two_hundred_identical_calls_make_one_job(self):
        results, errors = [], []
        start = threading.Barrier(16)

        def caller():
            try:
                start.wait()
                for _ in range(200):
                    results.append(tasks.unique_add.enqueue(7, 7))
            except Exception as exc:  # Reported below, with the assertion.
                errors.append(exc)
            finally:
                connections.close_all()

        run_in_threads(caller, 16)
        assert errors == []
        assert len(results) == 3200
        assert Job.objects.count() == 1
        assert {r.id for r in results} == {str(Job.objects.get().id)}
        assert Counter(r.created for r in results) == {False: 3199, True: 1}

    def test_across_period_boundaries_one_job_per_window(self):
        """Calls go on until they have met at least two windows of one second."""
        results, errors = [], []
        every_second = tasks.add.using(unique=Unique(period=1))
        start = threading.Barrier(16)

        def windows() -> int:
            return len(set(Job.objects.values_list("unique_window", flat=True)))

        def caller():
            try:
                start.wait()
                calls = 0
                while calls < 200 or (windows() < 2 and calls < 20_000):
                    results.append(every_second.enqueue(7, 7))
                    calls += 1
            except Exception as exc:
                errors.append(exc)
            finally:
                connections.close_all()

        run_in_threads(caller, 16)
        assert errors == []
        jobs = list(Job.objects.all())
        per_window = Counter(job.unique_window for job in jobs)
        assert len(per_window) >= 2
        assert set(per_window.values()) == {1}
        assert {r.id for r in results} == {str(job.id) for job in jobs}
        assert sum(r.created for r in results) == len(jobs)

    def test_a_worker_completing_the_job_frees_the_key_for_the_next_call(self, procs):
        """A real worker process completes the jobs while calls keep coming."""
        from tests.helpers import start_worker

        procs.append(start_worker("--queues", "default", "--concurrency", "2"))
        created = []
        while len(created) < 5:
            result = tasks.unique_add.enqueue(3, 4)
            if result.created:
                created.append(result.id)
            holding = Job.objects.filter(unique_key__isnull=False, state__in=UNFINISHED).count()
            assert holding <= 1
            wait_until(lambda: Job.objects.filter(state="available").count() == 0, timeout=60)
        wait_until(lambda: set(Job.objects.values_list("state", flat=True)) == {"completed"})
        assert Job.objects.count() == 5
        assert len({job.unique_key for job in Job.objects.all()}) == 1

    @pytest.mark.parametrize("first_commits", [True, False])
    def test_the_second_transaction_waits_for_the_first(self, first_commits):
        first_inserted, release = threading.Event(), threading.Event()
        outcome = {}

        def first():
            try:
                with transaction.atomic():
                    outcome["first"] = tasks.unique_add.enqueue(1, 2)
                    first_inserted.set()
                    release.wait(timeout=30)
                    if not first_commits:
                        raise RuntimeError("roll back")
            except RuntimeError:
                pass
            finally:
                connections.close_all()

        def second():
            try:
                with transaction.atomic():
                    outcome["second"] = tasks.unique_add.enqueue(1, 2)
            finally:
                connections.close_all()

        one, two = threading.Thread(target=first), threading.Thread(target=second)
        one.start()
        assert first_inserted.wait(timeout=30)
        two.start()
        wait_until(lambda: waiting_backends() >= 1)  # The second waits for the first.
        assert "second" not in outcome
        release.set()
        one.join(timeout=30)
        two.join(timeout=30)
        job = Job.objects.get()
        if first_commits:
            assert (outcome["second"].created, outcome["second"].id) == (False, str(job.id))
            assert outcome["first"].id == str(job.id)
        else:
            assert (outcome["second"].created, outcome["second"].id) == (True, str(job.id))


class TestBulk:
    def test_a_mixed_batch_in_a_few_statements(self):
        existing = [tasks.unique_add.enqueue(i, 0).id for i in range(10)]
        calls = [((i, 0), {}) for i in range(20)]  # 10 held already, 10 new.
        calls += [((i, 0), {}) for i in range(15, 20)]  # Duplicates of new calls of the batch.
        calls += [((100 + i, 0), {}, {"unique": False}) for i in range(3)]
        with CaptureQueriesContext(connection) as queries:
            results = tasks.unique_add.enqueue_many(calls)
        assert len(queries) <= 2  # ENQUEUE, and one read for the duplicates: none per call.
        assert [r.created for r in results] == [False] * 10 + [True] * 10 + [False] * 5 + [True] * 3
        assert [r.id for r in results[:10]] == existing
        assert [r.id for r in results[20:25]] == [r.id for r in results[15:20]]
        assert Job.objects.count() == 23
        assert all(r.args == list(call[0]) for r, call in zip(results, calls, strict=True))

    def test_per_call_idempotency_keys_and_unique_options(self):
        first = tasks.add.using(idempotency_key="order-1").enqueue(1, 1)
        results = tasks.add.enqueue_many(
            [
                ((1, 1), {}, {"idempotency_key": "order-1"}),
                ((2, 2), {}, {"idempotency_key": "order-2"}),
                ((2, 2), {}, {"idempotency_key": "order-2"}),
                ((3, 3), {}, {"unique": Unique()}),
                ((3, 3), {}, {"unique": Unique()}),
                ((4, 4), {}),
            ]
        )
        assert [r.created for r in results] == [False, True, False, True, False, True]
        assert results[0].id == first.id
        assert results[1].id == results[2].id and results[3].id == results[4].id
        assert Job.objects.count() == 4

    def test_a_reused_idempotency_key_leaves_nothing_of_the_batch(self):
        tasks.add.using(idempotency_key="order-1").enqueue(1, 1)
        with transaction.atomic():
            with pytest.raises(IdempotencyKeyReused, match="order-1"):
                tasks.add.enqueue_many([((5, 5), {}), ((2, 2), {}, {"idempotency_key": "order-1"})])
            assert Job.objects.count() == 1  # The caller's transaction goes on.
        assert Job.objects.count() == 1

    def test_replacing_calls_of_one_batch_leave_the_last_arguments(self):
        results = tasks.debounced.enqueue_many(
            [((42,), {"note": n}) for n in "abc"] + [((43,), {"note": "x"})]
        )
        assert [r.created for r in results] == [True, False, False, True]
        assert [r.replaced for r in results] == [False, True, True, False]
        assert Job.objects.get(pk=results[0].id).kwargs == {"note": "c"}
        # A second batch replaces the job that holds the key, in one more statement.
        with CaptureQueriesContext(connection) as queries:
            again = tasks.debounced.enqueue_many([((42,), {"note": "d"}), ((42,), {"note": "e"})])
        assert len(queries) == 2  # ENQUEUE, ENQUEUE_REPLACE.
        assert [(r.created, r.replaced, r.id) for r in again] == [(False, True, results[0].id)] * 2
        job = Job.objects.get(pk=results[0].id)
        assert job.kwargs == {"note": "e"} and job.uniqueness["replaced"] == 4

    @pytest.mark.parametrize(
        ("call", "message"),
        [
            ("not a call", "call 1: each call is \\(args, kwargs\\) or"),
            (((1,), {}, ["idempotency_key"]), "call 1: its options must be a dict"),
            (((1,), {}, {"priority": 5}), "call 1: unknown option\\(s\\) 'priority'"),
            (((1,), {}, {"unique": "yes"}), "call 1: unique must be a Unique"),
            (((1,), {}, {"idempotency_key": ""}), "call 1: idempotency_key must be"),
        ],
    )
    def test_a_bad_call_is_refused_before_anything_is_written(self, call, message):
        with pytest.raises(InvalidTask, match=message):
            tasks.unique_add.enqueue_many([((0, 0), {}), call])
        assert Job.objects.count() == 0


class TestRequeue:
    def test_refused_while_a_newer_job_holds_the_key(self, cur):
        first = tasks.unique_add.using(max_attempts=1).enqueue(1, 2)
        protocol.cancel(cur, ids=[int(first.id)])
        newer = tasks.unique_add.enqueue(1, 2)
        assert operations.requeue([int(first.id)]) == []
        assert Job.objects.get(pk=first.id).state == "cancelled"
        assert protocol.key_holders(cur, ids=[int(first.id)]) == {
            int(first.id): (int(newer.id), "available")
        }
        protocol.cancel(cur, ids=[int(newer.id)])
        assert operations.requeue([int(first.id)]) == [int(first.id)]
        assert Job.objects.get(pk=first.id).state == "available"

    def test_the_command_names_the_job_holding_the_key(self, cur):
        first = tasks.unique_add.enqueue(1, 2)
        protocol.cancel(cur, ids=[int(first.id)])
        newer = tasks.unique_add.enqueue(1, 2)
        out, err = io.StringIO(), io.StringIO()
        call_command("conveyor_jobs", "requeue", "--ids", first.id, stdout=out, stderr=err)
        assert out.getvalue() == "Requeued 0 job(s).\n"
        assert f"Job {first.id} was not requeued: its unique key is held by job {newer.id}" in (
            err.getvalue()
        )

    def test_the_command_selects_the_jobs_of_a_key(self):
        holder = tasks.unique_add.enqueue(1, 2)
        other = tasks.unique_add.enqueue(3, 4)
        key = Job.objects.get(pk=holder.id).unique_key
        out = io.StringIO()
        call_command("conveyor_jobs", "cancel", "--unique-key", key, stdout=out)
        assert out.getvalue() == "Cancelled 1 job(s).\n"
        assert Job.objects.get(pk=holder.id).state == "cancelled"
        assert Job.objects.get(pk=other.id).state == "available"
        assert tasks.unique_add.enqueue(1, 2).created  # The key is free again.

    def test_of_jobs_sharing_a_key_only_the_first_comes_back(self, cur):
        ids = []
        for _ in range(3):
            ids.append(int(tasks.unique_add.enqueue(1, 2).id))
            protocol.cancel(cur, ids=[ids[-1]])
        assert operations.requeue(ids) == [ids[0]]
        assert [job.state for job in keyed(Job.objects.get(pk=ids[0]).unique_key)] == [
            "available",
            "cancelled",
            "cancelled",
        ]

    def test_a_key_taken_while_requeue_runs_refuses_it_without_ending_the_transaction(self):
        first = tasks.unique_add.enqueue(1, 2)
        with connection.cursor() as cur:
            protocol.cancel(cur, ids=[int(first.id)])
        with connect("default", dsn=direct_dsn()) as other:
            other.execute("BEGIN")
            holder = Job.objects.get(pk=first.id)
            other.execute(
                "INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority,"
                " state, attempt, max_attempts, run_after, lease_version, errors, enqueued_at,"
                " unique_key, unique_states, uniqueness) SELECT task_path, args, kwargs, queue,"
                " backend, priority, 'available', 0, 1, now(), 0, '[]', now(), unique_key,"
                " unique_states, uniqueness FROM conveyor_job WHERE id = %s",
                [holder.id],
            )
            outcome = {}

            def requeue():
                try:
                    with transaction.atomic():
                        outcome["requeued"] = operations.requeue([holder.id])
                        outcome["still usable"] = Job.objects.count()
                finally:
                    connections.close_all()

            thread = threading.Thread(target=requeue)
            thread.start()
            wait_until(lambda: waiting_backends() >= 1)  # Its index entry waits for ours.
            other.execute("COMMIT")
            thread.join(timeout=30)
        assert outcome == {"requeued": [], "still usable": 2}
        assert Job.objects.get(pk=first.id).state == "cancelled"


def index_size(cur, name: str) -> int:
    cur.execute("SELECT pg_relation_size(%s::regclass)", [name])
    return cur.fetchone()[0]


class TestTheIndex:
    def test_jobs_without_a_key_have_no_entry(self, cur):
        tasks.add.enqueue_many([((i, i), {}) for i in range(500)])
        run_burst()
        for index in ("conveyor_job_unique_key_uniq", "conveyor_job_released_key_idx"):
            assert index_size(cur, index) == 8192, index  # The metapage alone.

    def test_a_keyed_job_is_in_one_of_the_two_indexes(self, cur):
        tasks.unique_add.enqueue_many([((i, i), {}) for i in range(500)])
        assert index_size(cur, "conveyor_job_unique_key_uniq") > 8192
        assert index_size(cur, "conveyor_job_released_key_idx") == 8192  # All hold their key.
        run_burst()
        cur.execute("SELECT count(*) FROM conveyor_job WHERE unique_states ? state")
        assert cur.fetchone()[0] == 0  # Completed: none holds its key any more.
        assert index_size(cur, "conveyor_job_released_key_idx") > 8192

    def test_its_predicate_reads_the_jobs_own_states(self, cur):
        cur.execute("SELECT pg_get_indexdef('conveyor_job_unique_key_uniq'::regclass)")
        (definition,) = cur.fetchone()
        assert "CREATE UNIQUE INDEX" in definition
        assert "(unique_key, COALESCE(unique_window" in definition
        assert "WHERE ((unique_key IS NOT NULL) AND (unique_states ? (state)::text))" in definition

    def test_the_read_of_a_duplicate_uses_the_unique_index(self, cur):
        tasks.unique_add.enqueue_many([((i, 0), {}) for i in range(2000)])
        cur.execute("ANALYZE conveyor_job")
        cur.execute(
            "EXPLAIN " + protocol.ENQUEUED_JOBS,
            {"rows": '[{"ord": 0, "unique_key": "ab", "unique_period": null}]'},
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
        assert "conveyor_job_unique_key_uniq" in plan and "Seq Scan on conveyor_job" not in plan


def test_the_unique_violation_is_recognised_from_either_cursor():
    class Wrapped(Exception):
        pass

    error = psycopg.errors.UniqueViolation("duplicate key")
    wrapped = Wrapped()
    wrapped.__cause__ = error
    assert protocol._is_unique_violation(error) is True
    assert protocol._is_unique_violation(wrapped) is True
    assert protocol._is_unique_violation(ValueError()) is False
