"""The search syntax of the admin's job lists and the API's `q` filter: one parser.

A search is terms separated by spaces, all of which must match::

    tag:tenant:42  meta.request_id:ab12  args.0:COFFEE-1KG  kwargs.customer_id:42
    key:order-7    1234 (a bare word: id, idempotency key or part of a task path)

`parse()` turns the text into a `Search` or raises `InvalidSearch` naming
the term; `Search.where()` is its SQL predicate over `conveyor_job`'s own
columns (unqualified, so the admin's ORM queries and the API's raw ones
share it). Docs: docs/observability.md#search.

What each term reads: tags and meta their partial GIN indexes; `key:` the
idempotency key's unique index; args and kwargs nothing of their own, so a
search with them is bounded (`windowed`), unless a user's `AddSearchIndex`
covers the task and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import NotSupportedError, connections
from django.db.migrations.operations.base import Operation

from ..serialization import text_problem

MAX_TERMS = 8
MAX_VALUE_LENGTH = 255
FIELDS = ("tag", "key", "meta", "args", "kwargs")
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = ("true", "false", "null")
INDEX_PREFIX = "conveyor_job_search_"


class InvalidSearch(ValueError):
    """The search text does not follow the syntax; the message names the term."""


@dataclass(frozen=True, slots=True)
class Term:
    field: str  # One of FIELDS, or "text" for a bare word.
    path: tuple[str, ...]  # Keys (and args positions) below the field; () for tag, key, text.
    value: str
    quoted: bool = False  # A quoted value matches JSON strings only.

    def candidates(self) -> list[str]:
        """The JSON texts this term's value matches (meta, args, kwargs)."""
        found = [json.dumps(self.value)]
        if not self.quoted and (_JSON_NUMBER.fullmatch(self.value) or self.value in _LITERALS):
            found.append(self.value)
        return found

    @property
    def field_path(self) -> str:
        """`kwargs.customer_id`: how a search index names the field."""
        return ".".join((self.field, *self.path))


def _read_quoted(text: str, i: int) -> tuple[str, int]:
    """The value of the quoted string starting at text[i] ('"'), and the index after it."""
    out: list[str] = []
    i += 1
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        elif char == '"':
            return "".join(out), i + 1
        else:
            out.append(char)
            i += 1
    raise InvalidSearch(f'A quoted value is not closed: {text[-40:]!r}; end it with a ".')


def _tokens(text: str) -> Iterable[tuple[str | None, str, bool, str]]:
    """(field or None, value, quoted, the term as written) for each term."""
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        start = i
        head_end = i
        while head_end < len(text) and not text[head_end].isspace() and text[head_end] not in ':"':
            head_end += 1
        head = text[i:head_end]
        if head_end < len(text) and text[head_end] == ":":
            field, i = head, head_end + 1
        else:
            field = None
        if i < len(text) and text[i] == '"' and (field is not None or i == start):
            value, i = _read_quoted(text, i)
            quoted = True
        else:
            end = i
            while end < len(text) and not text[end].isspace():
                if text[end] == '"':
                    raise InvalidSearch(
                        f"Unexpected quote in {text[start : end + 1]!r}: quote the whole value, "
                        'as in meta.note:"two words".'
                    )
                end += 1
            value, i, quoted = text[i:end], end, False
        if i < len(text) and not text[i].isspace():
            raise InvalidSearch(f"Put a space after the quoted value in {text[start : i + 1]!r}.")
        yield field, value, quoted, text[start:i]


def _term(field: str | None, value: str, quoted: bool, written: str) -> Term:
    if field is None:
        return Term("text", (), value, quoted)
    name, *path = field.split(".") if field else [""]
    if name not in FIELDS:
        raise InvalidSearch(
            f"Unknown search field {name!r} in {written!r}: use tag:, key:, meta.<key>:, "
            "args.<position>: or kwargs.<name>:, or put a value with a colon in double quotes."
        )
    if name in ("tag", "key") and path:
        raise InvalidSearch(f"{name}: takes no path, as in {name}:value, not {written!r}.")
    if name in ("meta", "args", "kwargs") and not path:
        example = {"meta": "meta.request_id:ab12", "args": "args.0:x", "kwargs": "kwargs.id:42"}
        raise InvalidSearch(f"{written!r} needs a path, as in {example[name]}.")
    for segment in path:
        if not _SEGMENT.fullmatch(segment):
            raise InvalidSearch(
                f"{segment!r} in {written!r} is not a key: keys are letters, digits, _ and -."
            )
    if name == "args" and not path[0].isdigit():
        raise InvalidSearch(f"args takes a position from 0, as in args.0:x, not {written!r}.")
    if not value:
        raise InvalidSearch(f"{written!r} has no value: write {field}:<value>.")
    return Term(name, tuple(path), value, quoted)


def parse(text: str) -> Search:
    """The search `text` describes; InvalidSearch names what is wrong."""
    if problem := text_problem(text):
        raise InvalidSearch(f"The search {problem}.")
    terms = [_term(*token) for token in _tokens(text)]
    if len(terms) > MAX_TERMS:
        raise InvalidSearch(f"A search has at most {MAX_TERMS} terms, not {len(terms)}.")
    for term in terms:
        if len(term.value) > MAX_VALUE_LENGTH:
            raise InvalidSearch(
                f"A search value has at most {MAX_VALUE_LENGTH} characters; "
                f"{term.value[:40]!r}... has {len(term.value)}."
            )
    return Search(tuple(terms))


def _nested(path: tuple[str, ...], leaf: Any) -> Any:
    for key in reversed(path):
        leaf = {key: leaf}
    return leaf


def json_path(term: Term) -> str:
    """The `#>` path literal of an args/kwargs term, e.g. '{customer_id}' (keys are plain)."""
    return "'{" + ",".join(term.path) + "}'::text[]"


def field_expression(term: Term) -> str:
    """The expression an args/kwargs term compares, as its search index is built on it."""
    return f"({term.field} #> {json_path(term)})"


@dataclass(frozen=True, slots=True)
class Search:
    terms: tuple[Term, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def scanned(self) -> tuple[Term, ...]:
        """The args/kwargs terms: no index of their own."""
        return tuple(t for t in self.terms if t.field in ("args", "kwargs"))

    def where(
        self, task_paths: Iterable[str] = (), *, named: bool = False
    ) -> tuple[str, list[Any] | dict[str, Any]]:
        """The SQL predicate (AND of the terms) and its parameters.

        `task_paths`: the known tasks, for bare words (part of a task path).
        `named`: `%(search_N)s` placeholders and a dict, for raw SQL with
        named parameters (the API's pages); else `%s` and a list (the ORM).
        """
        params: list[Any] = []

        def bind(value: Any) -> str:
            params.append(value)
            return f"%(search_{len(params) - 1})s" if named else "%s"

        parts: list[str] = []
        tags = [t.value for t in self.terms if t.field == "tag"]
        if tags:
            parts.append(f"tags @> {bind(json.dumps(tags))}::jsonb")
        for term in self.terms:
            if term.field == "key":
                parts.append(f"idempotency_key = {bind(term.value)}")
            elif term.field == "meta":
                either = " OR ".join(
                    f"meta @> {bind(json.dumps(_nested(term.path, json.loads(c))))}::jsonb"
                    for c in term.candidates()
                )
                parts.append(f"({either})")
            elif term.field in ("args", "kwargs"):
                parts.append(f"{field_expression(term)} = ANY({bind(term.candidates())}::jsonb[])")
            elif term.field == "text":
                parts.append(_text(term.value, task_paths, bind))
        sql = " AND ".join(parts) or "true"
        if named:
            return sql, {f"search_{i}": value for i, value in enumerate(params)}
        return sql, params

    def windowed(self, database: str, task: str | None) -> bool:
        """Whether this search must be bounded to the newest SEARCH_SCAN_ROWS jobs.

        It must when it has args/kwargs terms, unless the list is filtered
        to one task and an AddSearchIndex covers each of them for that task.
        """
        if not self.scanned:
            return False
        if not task:
            return True
        wanted = {index_name(task, term.field_path) for term in self.scanned}
        return not wanted <= existing_indexes(database, wanted)


def _text(value: str, task_paths: Iterable[str], bind: Callable[[Any], str]) -> str:
    """A bare word: an exact id or idempotency key, or part of a known task's path."""
    either = [f"idempotency_key = {bind(value)}"]
    if value.isdigit() and len(value) <= 18:
        either.append(f"id = {bind(int(value))}")
    paths = [p for p in task_paths if value.lower() in p.lower()]
    if paths:
        either.append(f"task_path = ANY({bind(paths)})")
    return "(" + " OR ".join(either) + ")"


def index_name(task: str, field: str) -> str:
    """The name AddSearchIndex gives the index of one task's field (63 bytes at most)."""
    digest = hashlib.sha1(f"{task}\n{field}".encode()).hexdigest()[:16]
    return f"{INDEX_PREFIX}{digest}"


EXISTING_INDEXES = "SELECT relname FROM pg_class WHERE relkind = 'i' AND relname = ANY(%s)"


def existing_indexes(database: str, names: Iterable[str]) -> set[str]:
    """Which of these index names exist (one catalog read)."""
    with connections[database].cursor() as cursor:
        cursor.execute(EXISTING_INDEXES, [sorted(names)])
        return {name for (name,) in cursor.fetchall()}


def search_index_sql(task: str, field: str) -> tuple[list[str], list[str]]:
    """The statements that add, and drop, the search index of one task's argument.

    The index is partial (that task's jobs only), so PostgreSQL ignores its
    statistics when it estimates a search; the expression's own statistics
    (CREATE STATISTICS) tell the planner how rare a value is, so that it
    reads the index rather than walking the table newest first.
    """
    (term,) = parse(f"{field}:x").terms
    if term.field not in ("args", "kwargs"):
        raise InvalidSearch(
            f"A search index is for args.<position> or kwargs.<name>, not {field!r}."
        )
    if problem := text_problem(task):
        raise InvalidSearch(f"The task {task!r:.80} {problem}.")
    name = index_name(task, term.field_path)
    literal = "'" + task.replace("'", "''") + "'"
    expression = field_expression(term)
    create = [
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON conveyor_job "
        f"({expression}, id) WHERE task_path = {literal}",
        f"CREATE STATISTICS IF NOT EXISTS {name}_stats ON ({expression}) FROM conveyor_job",
        "ANALYZE conveyor_job",
    ]
    drop = [f"DROP STATISTICS IF EXISTS {name}_stats", f"DROP INDEX CONCURRENTLY IF EXISTS {name}"]
    return create, drop


class AddSearchIndex(Operation):
    """A migration operation: index one task's argument, so searching it is not bounded.

    Only that task's jobs get an entry. Run it in a migration with
    `atomic = False` (the index is built CONCURRENTLY, the table stays
    writable); see docs/observability.md#search.
    """

    reduces_to_sql = True
    reversible = True

    def __init__(self, task: str, field: str) -> None:
        self.task, self.field = task, field
        search_index_sql(task, field)  # Refuse a bad field when the migration loads.

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [], {"task": self.task, "field": self.field}

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # The index is not part of the model's state: makemigrations never sees it.

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._refuse_in_transaction(schema_editor)
        for sql in search_index_sql(self.task, self.field)[0]:
            schema_editor.execute(sql)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._refuse_in_transaction(schema_editor)
        for sql in search_index_sql(self.task, self.field)[1]:
            schema_editor.execute(sql)

    def describe(self) -> str:
        return f"Create a search index on {self.field} of {self.task} jobs"

    def _refuse_in_transaction(self, schema_editor: Any) -> None:
        # PostgreSQL's own error would not say which migration setting to change.
        if schema_editor.connection.in_atomic_block:
            raise NotSupportedError(
                f"AddSearchIndex({self.task!r}, {self.field!r}) builds its index CONCURRENTLY, "
                "which cannot run inside a transaction: set atomic = False on the migration."
            )
