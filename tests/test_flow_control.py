"""Flow control in the claim (docs/flow-control.md): CLAIM_LIMITED and its lock, one by one.

These run the SQL of `protocol.py` directly against the real database, with
several claimers (owners) taking turns; tests/test_flow_control_workers.py
runs real worker processes against limited queues.
"""

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_conveyor import limits, protocol
from django_conveyor.limits import Limits
from django_conveyor.models import Job, Queue
from django_conveyor.worker.claims import Claimer, ClaimStep
from django_conveyor.worker.connections import connect
from django_conveyor.worker.services.limits import LimitsService
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "limited"


def limit(name: str = QUEUE, **values) -> None:
    rate = values.pop("rate", None)
    limits.set_limits(name, Limits(rate=limits.parse_rate(rate), **values), actor="test")


def claim(owner: str = "w1", n: int = 10, *, queue: str = QUEUE, isolated: bool = False):
    """One limited claim as a worker's cycle runs it: lock, then claim, in one transaction."""
    with transaction.atomic(), connection.cursor() as cur:
        locked = protocol.lock_limited(cur, queues=[queue])
        if queue not in locked:
            return []
        return protocol.claim_limited(
            cur, owner=owner, queue=queue, limit=n, lease_seconds=30, isolated=isolated
        )


def running(queue: str = QUEUE, key: str | None = None) -> int:
    rows = Job.objects.filter(queue=queue, state="running")
    return (rows.filter(concurrency_key=key) if key else rows).count()


def finish(ids) -> None:
    Job.objects.filter(id__in=list(ids)).update(
        state="completed", finished_at=timezone.now(), lease_owner=None
    )


def jobs(count: int, key: str | None = None, **fields) -> list[Job]:
    return [JobFactory(queue=QUEUE, concurrency_key=key, **fields) for _ in range(count)]


def test_a_limited_queue_is_left_to_claim_limited(cur):
    jobs(3)
    limit(concurrency=5)
    assert protocol.claim(cur, owner="w1", queues=[QUEUE], limit=10, lease_seconds=30) == []
    assert (
        protocol.claim(cur, owner="w1", queues=[QUEUE, "default"], limit=10, lease_seconds=30) == []
    )
    assert len(claim()) == 3


def test_queue_concurrency_counts_every_workers_running_jobs():
    jobs(10)
    limit(concurrency=3)
    assert len(claim("w1", 2)) == 2
    assert len(claim("w2", 10)) == 1  # w1's two count: one slot left.
    assert claim("w3", 10) == []
    assert running() == 3
    finish(Job.objects.filter(state="running", lease_owner="w1").values_list("id", flat=True)[:1])
    assert len(claim("w3", 10)) == 1
    assert running() == 3


def test_an_expired_lease_keeps_its_slot_until_reaped(cur):
    jobs(4)
    limit(concurrency=2)
    first = claim("w1", 2)
    Job.objects.filter(id__in=[lease.id for lease in first]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert claim("w2", 2) == []  # The frozen holder may still run them.
    assert len(protocol.reap(cur)) == 2
    assert len(claim("w2", 5)) == 2  # Two slots: the two reaped jobs are isolated, left alone.


def test_key_concurrency_one_runs_each_key_serially():
    jobs(5, "a")
    jobs(5, "b")
    jobs(2)  # No key: not limited by it.
    limit(key_concurrency=1)
    first = claim("w1", 10)
    assert sorted(str(Job.objects.get(id=lease.id).concurrency_key) for lease in first) == [
        "None", "None", "a", "b",
    ]  # fmt: skip
    assert claim("w2", 10) == []
    finish([lease.id for lease in first if Job.objects.get(id=lease.id).concurrency_key == "a"])
    [again] = claim("w2", 10)
    assert Job.objects.get(id=again.id).concurrency_key == "a"
    assert running(key="a") == running(key="b") == 1


def test_fair_serves_a_small_key_before_a_large_backlog_is_done():
    Job.objects.bulk_create(
        [
            Job(task_path="tests.testapp.tasks.add", queue=QUEUE, concurrency_key="big",
                run_after=timezone.now(), enqueued_at=timezone.now(), args=[], kwargs={})
            for _ in range(2000)
        ]
    )  # fmt: skip
    small = jobs(10, "small")
    limit(fair=True)
    taken = []
    for _ in range(5):
        leases = claim("w1", 4)
        taken += [lease.id for lease in leases]
        finish(lease.id for lease in leases)
    small_ids = {job.id for job in small}
    assert len(small_ids & set(taken)) == 10  # Half of each batch went to the small key.
    assert len(taken) == 20


def test_fair_rotates_through_many_keys():
    for key in "abcdef":
        jobs(3, key)
    limit(fair=True)
    served = []
    for _ in range(6):
        [lease] = claim("w1", 1)
        served.append(Job.objects.get(id=lease.id).concurrency_key)
        finish([lease.id])
    assert sorted(served) == list("abcdef")


def test_rate_limits_starts_per_window():
    jobs(10)
    limit(rate="3/s")
    assert len(claim("w1", 2)) == 2
    assert len(claim("w2", 10)) == 1
    assert claim("w3", 10) == []
    time.sleep(1.05)
    assert len(claim("w3", 10)) == 3
    stamps = sorted(Job.objects.filter(state="running").values_list("started_at", flat=True))
    for i in range(len(stamps) - 3):
        assert stamps[i + 3] - stamps[i] >= dt.timedelta(seconds=1)


def test_limits_combine():
    jobs(10, "a")
    jobs(10, "b")
    limit(concurrency=3, key_concurrency=2, rate="100/h")
    leases = claim("w1", 10)
    assert len(leases) == 3
    assert max(running(key="a"), running(key="b")) == 2


def claim_ahead(owner: str, limit: int, free: int) -> int:
    """A limited claim of a worker with `free` free slots and a claim-ahead buffer."""
    with transaction.atomic(), connection.cursor() as cur:
        protocol.lock_limited(cur, queues=[QUEUE])
        leases = protocol.claim_limited(
            cur, owner=owner, queue=QUEUE, limit=limit, free=free, lease_seconds=30
        )
    return len(leases)


@pytest.mark.parametrize(
    "values, taken",
    [
        # Far from the limit: the free slots, then half the headroom they leave.
        ({"concurrency": 100}, [4 + 36, 4 + 28, 4 + 12, 4 + 4]),
        # Near it: the free slots, and ahead only while half the headroom is left.
        ({"concurrency": 10}, [4 + 3, 3, 0, 0]),
        # A rate counts claims as starts: never claimed ahead.
        ({"rate": "1000/s"}, [4, 4, 4, 4]),
        # A key limit alone (no queue limit): ahead as far as the keys allow.
        ({"key_concurrency": 10}, [40, 40, 20, 0]),
    ],
    ids=["concurrency-far", "concurrency-near", "rate", "key-concurrency"],
)
def test_a_limited_claim_claims_ahead_only_while_the_limit_is_far(values, taken):
    for key in "abcdefghij":
        jobs(10, key)
    limit(**values)
    got = [claim_ahead(f"w{i}", limit=40, free=4) for i in range(4)]
    assert got == taken
    assert running() == sum(taken)


@pytest.mark.parametrize(
    "values, free, claimed, locked",
    [
        ({"concurrency": 100}, 0, 10, True),  # Claimed ahead with no free slot.
        ({"rate": "1000/s"}, 0, 0, False),  # Nothing to claim: not even locked.
        ({"rate": "1000/s"}, 2, 2, True),  # The free slots only.
    ],
    ids=["concurrency-ahead", "rate-no-free-slot", "rate-free-slots"],
)
def test_a_worker_locks_a_rate_limited_queue_only_for_its_free_slots(values, free, claimed, locked):
    jobs(20)
    limit(**values)
    claimer = Claimer(owner="w1", queues=[QUEUE], concurrency=4, lease_seconds=30, prefetch=None)
    with connect("default") as conn:
        with conn.cursor() as cur:
            LimitsService([QUEUE], claimer.route).run_once(cur)
        with conn.transaction(), conn.cursor() as cur:
            leases = claimer.run(cur, ClaimStep(protocol.claim, 10, free=free), 10)
            with connect("default") as other, other.cursor() as probe:
                probe.execute("SET lock_timeout = '50ms'")
                try:
                    probe.execute(
                        "SELECT 1 FROM conveyor_queue WHERE name = %s FOR NO KEY UPDATE", [QUEUE]
                    )
                    held = False
                except psycopg.errors.LockNotAvailable:
                    held = True
    assert len(leases) == claimed
    assert held is locked


def test_paused_and_unlimited_queues_are_not_locked(cur):
    jobs(2)
    limit(concurrency=1)
    Queue.objects.filter(name=QUEUE).update(paused=True)
    assert claim() == []
    Queue.objects.filter(name=QUEUE).update(paused=False)
    limit()  # Every limit removed: the plain claim takes the queue again.
    assert protocol.lock_limited(cur, queues=[QUEUE]) == []
    assert len(protocol.claim(cur, owner="w1", queues=[QUEUE], limit=5, lease_seconds=30)) == 2


def test_isolated_jobs_of_a_limited_queue_are_claimed_alone_within_the_limit():
    jobs(2, isolated=True)
    jobs(2)
    limit(concurrency=2)
    [alone] = claim("w1", 5, isolated=True)
    assert alone.isolated
    assert claim("w1", 5, isolated=True) == []  # w1 runs an isolated job already.
    assert len(claim("w2", 5)) == 1  # One slot left, and not an isolated job.
    assert claim("w3", 1, isolated=True) == []  # The limit holds for isolated jobs too.


def test_racing_claimers_never_exceed_the_limit():
    """Eight connections claim in a loop while a sampler reads the running count."""
    jobs(300)
    limit(concurrency=4)
    over: list[int] = []
    stop = threading.Event()
    claimed: list[int] = []

    def claimer(owner: str) -> None:
        with connect("default") as conn:
            while not stop.is_set():
                with conn.transaction(), conn.cursor() as cur:
                    if protocol.lock_limited(cur, queues=[QUEUE]):
                        leases = protocol.claim_limited(
                            cur, owner=owner, queue=QUEUE, limit=6, free=2, lease_seconds=30
                        )
                        claimed.extend(lease.id for lease in leases)
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(
                        "UPDATE conveyor_job SET state = 'completed', lease_owner = NULL "
                        "WHERE id = ANY(%s) AND lease_owner = %s",
                        [[lease.id for lease in leases] if leases else [], owner],
                    )

    def sampler() -> None:
        with connect("default") as conn, conn.cursor() as cur:
            while not stop.is_set():
                cur.execute(
                    "SELECT count(*) FROM conveyor_job WHERE queue = %s AND state = 'running'",
                    [QUEUE],
                )
                over.append(cur.fetchone()[0])

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(8)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    try:
        while Job.objects.filter(queue=QUEUE, state="completed").count() < 300:
            assert time.monotonic() < deadline, "the racing claimers did not drain the queue"
            assert all(thread.is_alive() for thread in threads), "a claimer thread died"
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert len(claimed) == len(set(claimed)) == 300
    assert max(over) <= 4
    assert len(over) > 20


def test_the_claim_plan_of_a_limited_queue_is_bounded_by_the_batch(cur):
    """A 10^5 backlog of one key: the fair claim reads a few rows, not the backlog."""
    cur.execute(
        """INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state,
               attempt, max_attempts, run_after, lease_version, errors, enqueued_at,
               concurrency_key)
           SELECT 'tests.testapp.tasks.add', '[]', '{}', %s, 'default', 0, 'available', 0, 3,
                  now(), 0, '[]', now(), 'big' FROM generate_series(1, 100000)""",
        [QUEUE],
    )
    jobs(5, "small")
    limit(fair=True, key_concurrency=50)
    # Each ANALYZE samples anew, and a sample without the small key once made
    # the planner walk the claim order past the backlog: look at several.
    for _ in range(8):
        cur.execute("ANALYZE conveyor_job")
        with transaction.atomic():
            protocol.lock_limited(cur, queues=[QUEUE])
            cur.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + protocol.CLAIM_LIMITED,
                claim_params(10, "w1"),
            )
            plan = cur.fetchone()[0][0]
            transaction.set_rollback(True)
        top = plan["Plan"]
        buffers = top["Shared Hit Blocks"] + top.get("Shared Read Blocks", 0)
        assert buffers < 2000, heavy_nodes(top)  # The backlog alone is thousands of pages.


@pytest.mark.parametrize("values", [{"key_concurrency": 2}, {"fair": True, "key_concurrency": 2}])
def test_a_keyed_claim_reads_the_running_rows_once_not_once_per_key(cur, values):
    """Counted per walked key, the running rows were read 1,000 times in a claim of 1,000."""
    for key in range(40):
        jobs(3, f"k{key:02}")
    limit(**values)
    assert claim_ahead("w1", limit=40, free=40) == 40  # One running job in each key.
    with transaction.atomic():
        protocol.lock_limited(cur, queues=[QUEUE])
        cur.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + protocol.CLAIM_LIMITED,
            claim_params(40, "w2"),
        )
        plan = cur.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    reads = running_reads(plan)
    assert reads, "the claim did not read the running rows"
    assert all(loops <= 1 for _, loops in reads), reads


def running_reads(node, found=None):
    """(index, loops) of each plan node that reads conveyor_job's running rows."""
    found = [] if found is None else found
    if node.get("Index Name") in ("conveyor_job_reap_idx", "conveyor_job_key_running_idx"):
        found.append((node["Index Name"], node.get("Actual Loops", 0)))
    for child in node.get("Plans", []):
        running_reads(child, found)
    return found


def claim_params(n: int, owner: str) -> dict:
    """CLAIM_LIMITED's parameters for a claim of `n` free slots, for EXPLAIN."""
    return {"queue": QUEUE, "limit": n, "free": n, "owner": owner, "lease": 30, "isolated": False}


def heavy_nodes(node, found=None):
    """The plan's scans of conveyor_job, most pages first, for a failure's message."""
    found = [] if found is None else found
    if node.get("Relation Name") == "conveyor_job":
        pages = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        found.append((pages, node.get("Index Name"), node.get("Filter")))
    for child in node.get("Plans", []):
        heavy_nodes(child, found)
    return sorted(found, key=lambda item: item[0], reverse=True)[:5]


# -- The concurrency key at enqueue --------------------------------------------------------------


def test_the_key_is_given_per_call_or_computed_per_task():
    from tests.testapp import tasks

    per_call = tasks.add.using(concurrency_key="tenant:7").enqueue(1, 2)
    computed = tasks.sync_account.enqueue(42)
    unkeyed = tasks.add.enqueue(1, 2)
    keys = dict(Job.objects.values_list("id", "concurrency_key"))
    assert keys[int(per_call.id)] == "tenant:7"
    assert keys[int(computed.id)] == "account:42"
    assert keys[int(unkeyed.id)] is None
    many = tasks.sync_account.enqueue_many([((1,), {}), ((2,), {})])
    assert [Job.objects.get(id=r.id).concurrency_key for r in many] == ["account:1", "account:2"]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "concurrency_key must be a non-empty string"),
        ("x" * 256, "at most 255 characters"),
        (7, "concurrency_key must be a non-empty string"),
        ("a\x00b", "concurrency_key 'a\\x00b'"),
    ],
)
def test_a_bad_key_is_refused_and_nothing_is_written(key, message):
    from django_conveyor.compat import InvalidTask
    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match=message.replace("\\", "\\\\")):
        tasks.add.using(concurrency_key=key).enqueue(1, 2)
    assert Job.objects.count() == 0


def test_a_key_function_that_fails_names_the_task():
    from django_conveyor.compat import InvalidTask
    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match="sync_account's concurrency_key function raised"):
        tasks.sync_account.enqueue()  # The lambda needs `account`.
    bad = tasks.sync_account.using(concurrency_key=lambda *a, **k: 5)
    with pytest.raises(InvalidTask, match="returned a bad key"):
        bad.enqueue(1)
    assert Job.objects.count() == 0


# -- Declared limits: checks and sync --------------------------------------------------------------


@pytest.mark.parametrize(
    ("queues", "error", "names"),
    [
        ([], "conveyor.E120", "CONVEYOR['QUEUES'] must be a dict"),
        ({"q": 5}, "conveyor.E120", "CONVEYOR['QUEUES']['q'] must be a dict"),
        ({"q": {"limit": 5}}, "conveyor.E121", "CONVEYOR['QUEUES']['q']['limit']"),
        ({"q": {"concurrency": 0}}, "conveyor.E122", "CONVEYOR['QUEUES']['q']['concurrency']"),
        ({"q": {"key_concurrency": -1}}, "conveyor.E122", "['key_concurrency']"),
        ({"q": {"concurrency": True}}, "conveyor.E122", "['concurrency']"),
        ({"q": {"rate": "fast"}}, "conveyor.E123", "CONVEYOR['QUEUES']['q']['rate']"),
        ({"q": {"rate": "0/s"}}, "conveyor.E123", "'0/s'"),
        ({"q": {"rate": "10/d"}}, "conveyor.E123", "'10/d'"),
        ({"q": {"fair": "yes"}}, "conveyor.E124", "CONVEYOR['QUEUES']['q']['fair']"),
        ({"": {"fair": True}}, "conveyor.E125", "a queue name"),
    ],
)
def test_bad_declarations_are_system_check_errors_naming_the_key(queues, error, names):
    from django.test import override_settings

    from django_conveyor.checks import check_queues

    with override_settings(CONVEYOR={"QUEUES": queues}):
        [found] = list(check_queues())
    assert found.id == error
    assert names in found.msg


def test_good_declarations_pass_the_check():
    from django.test import override_settings

    from django_conveyor.checks import check_queues

    good = {"payments": {"concurrency": 5, "rate": "100/m"}, "sync": {"key_concurrency": 1,
            "fair": True}, "h": {"rate": " 3 / h "}, "none": {"concurrency": None}}  # fmt: skip
    with override_settings(CONVEYOR={"QUEUES": good}):
        assert list(check_queues()) == []
        assert limits.declared()["h"].rate == limits.Rate(3, 3600)


def test_sync_writes_a_changed_declaration_and_keeps_an_operators_edit():
    from django.test import override_settings

    declared = {"QUEUES": {QUEUE: {"concurrency": 5, "rate": "100/m"}}}
    with override_settings(CONVEYOR=declared):
        assert limits.sync("default").written == 1
        assert limits.current(QUEUE) == Limits(concurrency=5, rate=limits.Rate(100, 60))
        limit(concurrency=2)  # An operator's edit at run time.
        assert limits.sync("default").kept == 1  # A restart keeps it.
        assert limits.current(QUEUE).concurrency == 2
    changed = {"QUEUES": {QUEUE: {"concurrency": 8}}}
    with override_settings(CONVEYOR=changed):
        assert limits.sync("default").written == 1  # The settings changed: they win.
        assert limits.current(QUEUE) == Limits(concurrency=8)
    row = Queue.objects.get(name=QUEUE)
    assert (row.limits_changed_by, row.declared_limits["concurrency"]) == ("settings", 8)


def test_the_job_page_shows_its_concurrency_key(admin_client):
    from django.urls import reverse

    job = JobFactory(concurrency_key="account:42")
    page = admin_client.get(reverse("admin:conveyor_job_change", args=[job.id]))
    assert page.status_code == 200
    assert b"account:42" in page.content
    assert b"Concurrency key" in page.content


def test_enqueue_many_takes_a_key_per_call_and_checks_it():
    from django_conveyor.compat import InvalidTask
    from tests.testapp import tasks

    results = tasks.add.enqueue_many(
        [((1, 2), {}, {"concurrency_key": "a"}), ((3, 4), {}), ((5, 6), {})]
    )
    assert [Job.objects.get(id=r.id).concurrency_key for r in results] == ["a", None, None]
    with pytest.raises(InvalidTask, match="enqueue_many\\(\\) call 1: concurrency_key"):
        tasks.add.enqueue_many([((1, 2), {}), ((1, 2), {}, {"concurrency_key": ""})])
    assert Job.objects.count() == 3  # Nothing of the refused batch.


def test_a_limited_claim_is_never_jit_compiled_and_the_session_keeps_its_setting():
    """CLAIM_LIMITED's estimate passes jit_above_cost under a backlog, and compiling
    cost about 150 ms per claim: LOCK_LIMITED turns JIT off for its transaction only."""
    limit(concurrency=5)
    jobs(2)
    with connection.cursor() as cur:
        cur.execute("SET jit = on")
        with transaction.atomic():
            assert protocol.lock_limited(cur, queues=[QUEUE]) == [QUEUE]
            cur.execute("SHOW jit")
            assert cur.fetchone()[0] == "off"
            assert len(protocol.claim_limited(cur, owner="w1", queue=QUEUE, limit=5,
                                              lease_seconds=30)) == 2  # fmt: skip
        cur.execute("SHOW jit")
        assert cur.fetchone()[0] == "on"
        cur.execute("RESET jit")
