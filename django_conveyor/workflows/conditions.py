"""Row conditions of `wait_until` gates: a model and a `Q`, stored as JSON.

A condition must outlive the process that defined it, so it is kept with
the gate: the model's label and the `Q` as plain data. Only what survives
that is accepted, when `wait_until()` is called: field lookups whose values
are JSON (strings, numbers, booleans, None, lists of them), dates and
datetimes, combined with `&`, `|` and `~`. Anything else (an `F()`, a
subquery, a model instance, an unknown field) is refused then, with
`InvalidCondition` naming it, never later in the worker.

`check_conditions()` evaluates the waiting ones and ends those a row
matches (CONDITION_MET): the gates service runs it on every pass
(worker/services/gates.py), and a workflow for its new gates that wait at
once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.apps import apps
from django.core.exceptions import FieldError
from django.db import DatabaseError, connections, models, transaction
from django.db.models import Q

from .. import protocol
from ..exceptions import InvalidCondition
from ..serialization import text_problem

logger = logging.getLogger(__name__)

MAX_CONDITION_BYTES = 16_384  # The stored condition, as JSON: a lookup, not a document.
CONDITION_BATCH = 100  # Waiting conditions checked per pass and worker.
_CONNECTORS = {Q.AND: "and", Q.OR: "or", Q.XOR: "xor"}
_FROM_CONNECTOR = {name: connector for connector, name in _CONNECTORS.items()}


def condition(model: Any, q: Any) -> dict[str, Any]:
    """The stored form of (model, q); refuses what cannot be stored or queried."""
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise InvalidCondition(
            f"wait_until() needs a model class as its first argument, not {model!r:.80}."
        )
    if model._meta.abstract or not apps.is_installed(model._meta.app_config.name):
        raise InvalidCondition(f"{model.__name__} is not a concrete model of an installed app.")
    if not isinstance(q, Q):
        raise InvalidCondition(f"wait_until() needs a Q(...) condition, not {q!r:.80}.")
    stored = {"model": model._meta.label, "q": _dump(q, "the condition")}
    size = len(json.dumps(stored).encode())
    if size > MAX_CONDITION_BYTES:
        raise InvalidCondition(
            f"The condition on {model._meta.label} is {size} bytes as JSON; at most "
            f"{MAX_CONDITION_BYTES} can be stored with a gate. Match on fewer values."
        )
    try:
        model._default_manager.filter(load_q(stored["q"])).query.get_compiler(using="default")
    except (FieldError, ValueError, TypeError) as exc:
        raise InvalidCondition(f"The condition on {model._meta.label} is not valid: {exc}") from exc
    return stored


def _dump(q: Q, path: str) -> dict[str, Any]:
    children = []
    for i, child in enumerate(q.children):
        where = f"{path}[{i}]"
        if isinstance(child, Q):
            children.append(_dump(child, where))
            continue
        lookup, value = child
        if not isinstance(lookup, str) or text_problem(lookup):
            raise InvalidCondition(f"{where} has a lookup that is not plain text: {lookup!r:.80}.")
        children.append([lookup, _value(value, f"{where} ({lookup})")])
    return {"op": _CONNECTORS[q.connector], "not": q.negated, "of": children}


def _value(value: Any, where: str) -> Any:
    """A lookup's value as JSON; dates and datetimes tagged so they come back as such."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise InvalidCondition(f"{where} is {value!r}: only finite numbers can be stored.")
    if isinstance(value, str):
        if problem := text_problem(value):
            raise InvalidCondition(f"{where} {problem}.")
        return value
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise InvalidCondition(f"{where} is a naive datetime; give it a time zone.")
        return {"datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, list | tuple):
        return [_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    kind = type(value).__name__
    raise InvalidCondition(
        f"{where} is a {kind} ({value!r:.60}), which cannot be stored with the gate: use "
        "strings, numbers, booleans, None, dates, datetimes or lists of them (no F(), "
        "subqueries or model instances; pass the instance's pk)."
    )


def load_q(data: dict[str, Any]) -> Q:
    """The Q of a stored condition."""
    children = [
        load_q(child) if isinstance(child, dict) else (child[0], _load_value(child[1]))
        for child in data["of"]
    ]
    q = Q(*children, _connector=_FROM_CONNECTOR[data["op"]])
    return ~q if data["not"] else q


def _load_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_load_value(item) for item in value]
    if isinstance(value, dict):
        if "datetime" in value:
            return dt.datetime.fromisoformat(value["datetime"])
        return dt.date.fromisoformat(value["date"])
    return value


def first_match(stored: dict[str, Any], *, using: str) -> Any:
    """The pk of a row matching the condition, or None (one indexed query)."""
    model = apps.get_model(stored["model"])
    return (
        model._default_manager.using(using)
        .filter(load_q(stored["q"]))
        .values_list("pk", flat=True)
        .order_by()
        .first()
    )


class Checked(NamedTuple):
    checked: int
    ended: int
    last_id: int  # The last gate checked, when the batch was full; else 0 (wrap around).


def check_conditions(
    database: str, *, after: int = 0, limit: int = CONDITION_BATCH, ids: Sequence[int] | None = None
) -> Checked:
    """Check waiting conditions (those after `after`, or `ids`) and end the met ones.

    Runs in a transaction (a savepoint inside the caller's) on Django's
    connection to `database`, where the conditions' models are read.
    """
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        waiting = protocol.waiting_conditions(cursor, after=after, limit=limit, ids=ids)
        rows = []
        for gate_id, stored in waiting:
            try:
                with transaction.atomic(using=database):
                    matched = first_match(stored, using=database)
            except (LookupError, FieldError, DatabaseError, ValueError, TypeError, KeyError) as exc:
                logger.warning("gate %s: its condition on %s failed: %s", gate_id,
                               stored.get("model"), exc)  # fmt: skip
                rows.append({"id": gate_id, "matched": None, "error": _error_text(stored, exc)})
                continue
            if matched is not None:
                rows.append({"id": gate_id, "matched": _json_pk(matched), "error": None})
        ended = protocol.condition_met(cursor, rows=rows)
    last = waiting[-1][0] if len(waiting) == limit else 0
    return Checked(len(waiting), len(ended), last)


def _json_pk(pk: Any) -> Any:
    return pk if isinstance(pk, int | str) else str(pk)  # A UUID, say.


def _error_text(stored: dict[str, Any], exc: Exception) -> str:
    return (
        f"The condition on {stored.get('model')} could not be evaluated: "
        f"{type(exc).__name__}: {exc}"
    )[:2000]
