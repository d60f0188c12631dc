"""The search syntax (docs/observability.md#search): one parser, what each term matches.

The parser alone first (every refusal names the term); then the predicates
against real rows, including how values match (a number or its string);
then the EXPLAIN of each shape on a table with rows enough for the planner
to choose the indexes it would choose in production.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_conveyor.models import Job
from django_conveyor.observability import search
from django_conveyor.observability.search import InvalidSearch, parse
from tests.factories import JobFactory


@pytest.mark.parametrize(
    ("text", "field", "path", "value", "quoted"),
    [
        ("tag:tenant:42", "tag", (), "tenant:42", False),
        ("meta.request_id:ab12", "meta", ("request_id",), "ab12", False),
        ("meta.batch.id:7", "meta", ("batch", "id"), "7", False),
        ("args.0:COFFEE-1KG", "args", ("0",), "COFFEE-1KG", False),
        ("kwargs.customer_id:42", "kwargs", ("customer_id",), "42", False),
        ('kwargs.customer_id:"42"', "kwargs", ("customer_id",), "42", True),
        ('meta.note:"two \\"quoted\\" words"', "meta", ("note",), 'two "quoted" words', True),
        ("key:cron:nightly:2026", "key", (), "cron:nightly:2026", False),
        ('"cron:nightly:2026"', "text", (), "cron:nightly:2026", True),
        ("1234", "text", (), "1234", False),
    ],
)
def test_each_term_is_read_as_documented(text, field, path, value, quoted):
    (term,) = parse(text).terms
    assert (term.field, term.path, term.value, term.quoted) == (field, path, value, quoted)


def test_terms_are_separated_by_spaces_and_all_kept_in_order():
    terms = parse("  tag:a   kwargs.x:1 \t meta.k:v ").terms
    assert [t.field for t in terms] == ["tag", "kwargs", "meta"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("foo:bar", "Unknown search field 'foo' in 'foo:bar'"),
        ("tag:", "'tag:' has no value"),
        ("meta:x", "'meta:x' needs a path"),
        ("kwargs:x", "'kwargs:x' needs a path"),
        ("args.x:1", "args takes a position from 0"),
        ("kwargs.a$:1", "'a$' in 'kwargs.a$:1' is not a key"),
        ('meta.a:"x', "A quoted value is not closed"),
        ('a"b', "Unexpected quote"),
        ('meta.a:"x"y', "Put a space after the quoted value"),
        ("tag.a:b", "tag: takes no path"),
        (" ".join(["tag:a"] * 9), "at most 8 terms, not 9"),
        ("tag:" + "x" * 256, "at most 255 characters"),
        ("tag:a\x00", "NUL character"),
    ],
)
def test_bad_syntax_is_refused_with_a_message_naming_the_term(text, message):
    with pytest.raises(InvalidSearch) as caught:
        parse(text)
    assert message in str(caught.value)


def test_an_unquoted_value_matches_strings_and_the_json_value_it_reads_as():
    (number,) = parse("kwargs.n:42").terms
    assert number.candidates() == ['"42"', "42"]
    (quoted,) = parse('kwargs.n:"42"').terms
    assert quoted.candidates() == ['"42"']
    (word,) = parse("kwargs.n:true").terms
    assert word.candidates() == ['"true"', "true"]
    (text,) = parse("kwargs.n:042").terms  # not a JSON number: a string only
    assert text.candidates() == ['"042"']


def ids(text: str) -> set[int]:
    sql, params = parse(text).where()
    return set(Job.objects.extra(where=[sql], params=params).values_list("id", flat=True))


@pytest.mark.django_db(databases=["default", "shard"])
def test_values_match_a_number_by_value_or_its_string_and_quotes_keep_strings_only():
    number = JobFactory(kwargs={"customer_id": 42}).id
    decimal = JobFactory(kwargs={"customer_id": 42.0}).id
    string = JobFactory(kwargs={"customer_id": "42"}).id
    JobFactory(kwargs={"customer_id": 420})
    JobFactory(kwargs={"customer_id": [42]})  # arrays never match a value
    JobFactory(kwargs={})
    assert ids("kwargs.customer_id:42") == {number, decimal, string}
    assert ids('kwargs.customer_id:"42"') == {string}


@pytest.mark.django_db(databases=["default", "shard"])
def test_args_positions_nested_keys_meta_and_tags_each_match_their_own_rows():
    coffee = JobFactory(args=["COFFEE-1KG", {"sku": "TEA"}]).id
    tea = JobFactory(args=["x", {"sku": "TEA"}]).id
    meta = JobFactory(meta={"request_id": "ab12", "batch": {"id": 7}}).id
    other_meta = JobFactory(meta={"request_id": "zz"}).id
    tagged = JobFactory(tags=["tenant:42", "import"]).id
    JobFactory(tags=["tenant:4"])
    assert ids("args.0:COFFEE-1KG") == {coffee}
    assert ids("args.1.sku:TEA") == {coffee, tea}
    assert ids("meta.request_id:ab12") == {meta}
    assert ids("meta.batch.id:7") == {meta}
    assert ids("meta.request_id:zz") == {other_meta}
    assert ids("tag:tenant:42") == {tagged}
    assert ids("tag:tenant:42 tag:import") == {tagged}
    assert ids("tag:tenant:42 meta.request_id:ab12") == set()


@pytest.mark.django_db(databases=["default", "shard"])
def test_bare_words_find_an_id_a_key_or_part_of_a_task_path():
    keyed = JobFactory(idempotency_key="order-7").id
    target = JobFactory(task_path="tests.testapp.tasks.send_email").id
    sql, params = parse(str(target)).where()
    assert target in set(Job.objects.extra(where=[sql], params=params).values_list("id", flat=True))
    assert ids("key:order-7") == {keyed}
    sql, params = parse("send_em").where(["tests.testapp.tasks.send_email"])
    found = set(Job.objects.extra(where=[sql], params=params).values_list("id", flat=True))
    assert target in found and keyed not in found


def test_index_names_fit_postgresql_and_differ_per_task_and_field():
    a = search.index_name("shop.tasks.charge", "kwargs.customer_id")
    b = search.index_name("shop.tasks.charge", "kwargs.order_id")
    assert a != b and len(a.encode()) <= 63 and a.startswith("conveyor_job_search_")


def plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        found = cursor.fetchone()[0]
    return json.dumps(found if not isinstance(found, str) else json.loads(found))


FILL = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, lease_version, errors, enqueued_at, finished_at, tags, meta)
SELECT 'tests.testapp.tasks.add', jsonb_build_array('SKU-' || i), jsonb_build_object('n', i),
       'default', 'default', 0, 'completed', 1, 5, now(), 1, '[]', now(), now(),
       CASE WHEN i %% 100 = 0 THEN jsonb_build_array('tenant:' || (i %% 1000)) END,
       CASE WHEN i %% 50 = 0 THEN jsonb_build_object('request_id', md5(i::text)) END
FROM generate_series(1, %s) AS i
"""


@pytest.fixture
def filled(django_db_blocker):
    with connection.cursor() as cursor:
        cursor.execute(FILL, [50_000])
        cursor.execute("ANALYZE conveyor_job")


def job_query(text: str) -> tuple[str, list]:
    sql, params = parse(text).where()
    return (
        "SELECT id FROM conveyor_job WHERE " + sql + " ORDER BY id DESC LIMIT 50",
        params,
    )


@pytest.mark.django_db(databases=["default", "shard"])
def test_explain_tags_and_meta_read_their_partial_gin_indexes(filled):
    assert "conveyor_job_tags_idx" in plan(*job_query("tag:tenant:400"))
    assert "conveyor_job_meta_idx" in plan(*job_query("meta.request_id:abc"))
    both = plan(*job_query("meta.n:7"))  # a number or its string: both through the index
    assert both.count("conveyor_job_meta_idx") == 2


@pytest.mark.django_db(databases=["default", "shard"])
def test_explain_an_args_search_is_bounded_and_an_added_index_lifts_the_bound(filled):
    from django_conveyor.observability.search import search_index_sql

    found = parse("kwargs.n:7")
    assert found.windowed("default", None) and found.windowed("default", "tests.testapp.tasks.add")
    create, _ = search_index_sql("tests.testapp.tasks.add", "kwargs.n")
    with connection.cursor() as cursor:
        for sql in create:
            cursor.execute(sql.replace(" CONCURRENTLY", ""))
    assert not found.windowed("default", "tests.testapp.tasks.add")
    assert found.windowed("default", "tests.testapp.tasks.other")
    sql, params = found.where()
    query = (
        "SELECT id FROM conveyor_job WHERE task_path = 'tests.testapp.tasks.add' AND "
        + sql + " ORDER BY id DESC LIMIT 50"
    )  # fmt: skip
    assert search.index_name("tests.testapp.tasks.add", "kwargs.n") in plan(query, params)


@pytest.mark.django_db(databases=["default", "shard"])
def test_a_job_without_tags_or_meta_has_no_entry_in_their_indexes():
    JobFactory.create_batch(20)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname IN "
            "('conveyor_job_tags_idx', 'conveyor_job_meta_idx') ORDER BY indexname"
        )
        definitions = [d for (d,) in cursor.fetchall()]
    assert "WHERE (meta IS NOT NULL)" in definitions[0] and "gin" in definitions[0]
    assert "WHERE (tags IS NOT NULL)" in definitions[1] and "jsonb_path_ops" in definitions[1]


JOBS = "/admin/conveyor/job/"
DEAD = "/admin/conveyor/deadletter/"


@pytest.mark.django_db(databases=["default", "shard"])
class TestAdmin:
    def found(self, client, url, **params):
        response = client.get(url, params)
        assert response.status_code == 200
        return response, {j.id for j in response.context["cl"].result_list}

    def test_the_job_list_and_the_dead_letters_take_the_syntax_with_their_filters(
        self, admin_client
    ):
        tagged = JobFactory(tags=["tenant:42"], kwargs={"customer_id": 42}).id
        dead = JobFactory(tags=["tenant:42"], dead=True).id
        JobFactory(tags=["tenant:4"], dead=True)
        assert self.found(admin_client, JOBS, q="tag:tenant:42")[1] == {tagged, dead}
        assert self.found(admin_client, JOBS, q="tag:tenant:42", state="dead")[1] == {dead}
        assert self.found(admin_client, DEAD, q="tag:tenant:42")[1] == {dead}
        assert self.found(admin_client, JOBS, q="kwargs.customer_id:42")[1] == {tagged}

    def test_bad_syntax_is_a_message_and_an_empty_list_never_a_500(self, admin_client):
        JobFactory()
        for url in (JOBS, DEAD):
            response, ids = self.found(admin_client, url, q="foo:bar")
            assert ids == set()
            assert "Unknown search field" in response.content.decode()

    def test_a_windowed_search_says_how_far_back_it_looked(self, admin_client, settings):
        settings.CONVEYOR = {**settings.CONVEYOR, "SEARCH_SCAN_ROWS": 1000}
        old = JobFactory(kwargs={"customer_id": 42}).id
        with connection.cursor() as cursor:
            cursor.execute(FILL, [1000])
        response, ids = self.found(admin_client, JOBS, q="kwargs.customer_id:42")
        assert old not in ids
        assert "searched the newest 1,000 jobs of this list" in response.content.decode()
        task = Job.objects.get(pk=old).task_path
        response, ids = self.found(admin_client, JOBS, q="kwargs.customer_id:42", task=task)
        assert "searched the newest" in response.content.decode()  # all jobs share that task


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
class TestApi:
    @pytest.fixture
    def api(self, client):
        from django_conveyor.api import keys

        headers = {"HTTP_AUTHORIZATION": "Bearer " + keys.create("svc", ["read"])[1]}
        return lambda **params: client.get("/conveyor/api/jobs", params, **headers)

    def test_q_filters_with_the_other_filters(self, api):
        tagged = JobFactory(tags=["tenant:42"], meta={"request_id": "ab12"}).id
        JobFactory(tags=["tenant:42"], queue="emails")
        body = api(q="tag:tenant:42 meta.request_id:ab12").json()
        assert [int(j["id"]) for j in body["items"]] == [tagged]
        assert len(api(q="tag:tenant:42").json()["items"]) == 2
        assert len(api(q="tag:tenant:42", queue="emails", state="available").json()["items"]) == 1

    def test_bad_syntax_is_a_400_naming_q(self, api):
        response = api(q='meta.a:"open')
        assert response.status_code == 400
        (error,) = response.json()["errors"]
        assert error["field"] == "q" and "A quoted value is not closed" in error["message"]

    def test_a_windowed_search_walks_older_windows_through_the_cursor(self, api, settings):
        settings.CONVEYOR = {**settings.CONVEYOR, "SEARCH_SCAN_ROWS": 1000}
        old = JobFactory(kwargs={"customer_id": 42}).id
        with connection.cursor() as cursor:
            cursor.execute(FILL, [2500])
        new = JobFactory(kwargs={"customer_id": 42}).id
        first = api(q="kwargs.customer_id:42").json()
        assert [int(j["id"]) for j in first["items"]] == [new]
        assert first["next_cursor"]
        seen, cursor = [], first["next_cursor"]
        for _ in range(5):
            page = api(q="kwargs.customer_id:42", cursor=cursor).json()
            seen += [int(j["id"]) for j in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [old] and cursor is None

    def test_openapi_describes_q(self, client):
        schema = client.get("/conveyor/api/openapi.json").json()
        parameters = schema["paths"]["/conveyor/api/jobs"]["get"]["parameters"]
        (q,) = [p for p in parameters if p["name"] == "q"]
        assert "tag:tenant:42" in q["description"]


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_add_search_index_in_a_migration_builds_and_drops_its_index_and_refuses_atomic():
    from django.db import NotSupportedError
    from django.db.migrations.state import ProjectState

    from django_conveyor.observability.search import AddSearchIndex

    task, name = "tests.testapp.tasks.add", search.index_name("tests.testapp.tasks.add", "kwargs.n")
    operation = AddSearchIndex(task=task, field="kwargs.n")

    def run(direction: str, atomic: bool) -> None:
        with connection.schema_editor(atomic=atomic) as editor:
            getattr(operation, direction)("tests", editor, ProjectState(), ProjectState())

    with pytest.raises(NotSupportedError, match="set atomic = False on the migration"):
        run("database_forwards", atomic=True)
    assert search.existing_indexes("default", [name]) == set()
    run("database_forwards", atomic=False)
    assert search.existing_indexes("default", [name]) == {name}
    assert not parse("kwargs.n:7").windowed("default", task)
    run("database_backwards", atomic=False)
    assert search.existing_indexes("default", [name]) == set()
    for field, message in (("meta.n", "is for args.<position> or kwargs.<name>"),
                           ("kwargs", "needs a path")):  # fmt: skip
        with pytest.raises(InvalidSearch, match=message):
            AddSearchIndex(task=task, field=field)
