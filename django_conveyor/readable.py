"""Values PostgreSQL holds that Python cannot load, and how every reader survives them.

PostgreSQL stores timestamps from 4713 BC to 294276 AD and `infinity`;
Python's datetime holds years 1 to 9999 (and `0001-01-01 00:30+01` is
1 BC in UTC). jsonb stores numbers of any length; Python's int stops at
4,300 digits. Nothing django-conveyor writes goes past what Python loads
(`bounds.instant_breach`, serialization.py), but a row written by hand, by
an older version or by a bug may; it must fail its own job, never a batch,
a queue, a worker or a page. Two ways, both free for readable rows:

- A worker's fetch (`fetch_all`): `fetchall()` as usual; only when it raises
  is the same result loaded again value by value, each value that fails
  becoming an `Unreadable` that names its column. The claim then fails that
  job alone (worker/attempts.py `unreadable`), the scheduler stops that
  schedule alone.
- Django's reads (admin, API, `get_result`): every timestamp column of the
  app is an `InstantField`, selected through `clamped()` (so any stored
  value loads, shown at the nearest end of what Python can show), and every
  JSON column decodes with `TolerantJSONDecoder` (a number past Python's
  limits becomes a `Decimal`). `select_list()` does the same for raw SQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from django.db import DatabaseError as DjangoDatabaseError
from django.db import models

from .bounds import EARLIEST_INSTANT, LATEST_INSTANT

_TEXT_SHOWN = 80  # Characters of an unreadable value quoted in an error.
_seen = 0  # Values replaced by Unreadable in this process: a cheap "anything new?" check.


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A stored value Python cannot load, in place of the value."""

    column: str
    text: str  # What PostgreSQL sent, shortened.
    reason: str  # What the loader said.

    def __str__(self) -> str:
        return f"unreadable {self.column} {self.text!r} ({self.reason})"


def seen() -> int:
    """How many values `fetch_all` has replaced by `Unreadable` in this process."""
    return _seen


def fetch_all(cursor: Any) -> list[tuple[Any, ...]]:
    """`cursor.fetchall()`; a value that cannot be loaded comes back as `Unreadable`.

    Works on psycopg's cursors and on Django's (which wrap them). Only a fetch
    that raised pays: its result is loaded again, value by value.
    """
    try:
        return cursor.fetchall()
    except (psycopg.DataError, ValueError, OverflowError, DjangoDatabaseError) as exc:
        if isinstance(exc, DjangoDatabaseError) and not isinstance(
            exc.__cause__, psycopg.DataError | ValueError | OverflowError
        ):
            raise
        raw = getattr(cursor, "cursor", cursor)  # Django's wrapper holds psycopg's cursor.
        if raw.pgresult is None:
            raise
        return _load_each(raw)


def _load_each(cursor: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
    global _seen
    result = cursor.pgresult
    assert result is not None
    names = [column.name for column in cursor.description or ()]
    loaders = []
    for col in range(result.nfields):
        oid, fmt = result.ftype(col), result.fformat(col)
        loaders.append(cursor.adapters.get_loader(oid, fmt)(oid, cursor))  # type: ignore[misc]
    rows = []
    for row in range(result.ntuples):
        values = []
        for col, loader in enumerate(loaders):
            data = result.get_value(row, col)
            try:
                values.append(None if data is None else loader.load(data))
            except (psycopg.DataError, ValueError, OverflowError) as exc:
                _seen += 1
                values.append(_unreadable(names[col], bytes(data), exc))
        rows.append(tuple(values))
    return rows


def _unreadable(column: str, data: bytes, exc: BaseException) -> Unreadable:
    text = data.decode("utf-8", "replace")
    if len(text) > _TEXT_SHOWN:
        text = f"{text[:_TEXT_SHOWN]}... ({len(text)} characters)"
    reason = str(exc).split("\n", 1)[0].split(";", 1)[0]
    return Unreadable(column, text, reason)


def unreadable_values(row: Sequence[Any]) -> list[Unreadable]:
    return [value for value in row if isinstance(value, Unreadable)]


def loads_or_unreadable(value: Any, column: str) -> Any:
    """jsonb as Python whichever cursor read it; text Python cannot load becomes `Unreadable`."""
    if not isinstance(value, str | bytes):
        return value  # psycopg decoded it already (or it is Unreadable, or NULL).
    try:
        return json.loads(value)
    except ValueError as exc:
        raw = value.encode() if isinstance(value, str) else value
        return _unreadable(column, raw, exc)


def _number(text: str) -> Any:
    """A JSON number as Python holds it, or as a Decimal past Python's own limits."""
    try:
        number = int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:  # More digits than Python's int may parse.
        return Decimal(text)
    if isinstance(number, float) and number in (float("inf"), float("-inf")):
        return Decimal(text)
    return number


class TolerantJSONDecoder(json.JSONDecoder):
    """JSONField's decoder: what Python cannot hold (5,000 digits, 1e400) is kept as Decimal."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().decode(s, *args, **kwargs)
        except ValueError:
            return json.loads(s, parse_int=_number, parse_float=_number)


def clamped(sql: str) -> str:
    """`sql`, a timestamptz expression, at most a day inside Python's datetime range.

    A CASE, not LEAST/GREATEST: those skip a NULL, which must stay NULL.
    """
    earliest = f"'{EARLIEST_INSTANT.isoformat()}'::timestamptz"
    latest = f"'{LATEST_INSTANT.isoformat()}'::timestamptz"
    return (
        f"CASE WHEN {sql} < {earliest} THEN {earliest} "
        f"WHEN {sql} > {latest} THEN {latest} ELSE {sql} END"
    )


class InstantField(models.DateTimeField):
    """A timestamptz column that every Django read can load and show (see `clamped`).

    Only the select list changes: filters and ordering compare the stored value.
    """

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        return clamped(sql), params


def select_list(model: type[models.Model], alias: str) -> str:
    """The columns of `model` for a raw SELECT from `alias`, instants clamped."""
    columns = []
    for field in model._meta.concrete_fields:
        column = f'{alias}."{field.column}"'
        if isinstance(field, InstantField):
            column = f'{clamped(column)} AS "{field.column}"'
        columns.append(column)
    return ", ".join(columns)
