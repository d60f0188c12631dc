"""JSON round trips for arguments and return values, with errors that point.

django.tasks requires arguments and return values to survive JSON; a bare
`TypeError` from deep inside a structure does not tell the user which value
broke it, so we find and name its path. A value must also be storable:
PostgreSQL's jsonb refuses text with a NUL character (`\\x00`) or a lone
surrogate, and a structure nested past `MAX_DEPTH` levels is refused here
rather than met as a `RecursionError` (or a stack-depth error) later.
Every check runs before any SQL, so a refused value writes nothing.

Error text (a traceback) is not refused but made storable, with a note
saying so (`storable_text`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from .exceptions import ArgumentsNotSerializable

MAX_DEPTH = 100  # Levels of lists and dicts an argument or a return value may nest.
_MAX_PATH = 120  # Characters of a value's path shown in a message.
REPLACED_NOTE = (
    "\n[django-conveyor: NUL characters and invalid UTF-8 in this text were replaced by "
    "escapes such as \\x00, because PostgreSQL cannot store them.]\n"
)


def text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store `text`, or None (cheap: ASCII text costs one scan)."""
    if "\x00" in text:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not UTF-8 and PostgreSQL cannot store"
    return None


def checked_name(value: Any, what: str, max_length: int) -> str:
    """`value` if it is a name PostgreSQL can store (1 to `max_length` characters), else a
    ValueError that starts with `what` ("The signal's name", "A checkpoint's name")."""
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise ValueError(
            f"{what} must be a non-empty string of at most {max_length} characters, "
            f"not {value!r:.80}."
        )
    if problem := text_problem(value):
        raise ValueError(f"{what} {value!r:.80} {problem}.")
    return value


def storable_text(text: str) -> str:
    """`text` as PostgreSQL can store it: NUL and lone surrogates escaped, and a note if so."""
    if text_problem(text) is None:
        return text
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8") + REPLACED_NOTE


def _short(path: str) -> str:
    return path if len(path) <= _MAX_PATH else f"{path[:_MAX_PATH]}..."


def _find_bad(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """The first value that cannot be stored as JSON: (its path, the problem)."""
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, str):
        problem = text_problem(value)
        return (path, problem) if problem else None
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return path, f"is {value!r}, which JSON cannot represent (only finite numbers)"
    if isinstance(value, list | tuple | dict):
        if depth > MAX_DEPTH:  # The arguments list itself is depth 0.
            return path, f"nests more than {MAX_DEPTH} levels of lists and dicts"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"{path} key {key!r}", _unserializable(key)
                if problem := text_problem(key):
                    return f"{path} key {key!r:.40}", problem
                if found := _find_bad(item, f"{path}[{key!r}]", depth + 1):
                    return found
            return None
        for i, item in enumerate(value):
            if found := _find_bad(item, f"{path}[{i}]", depth + 1):
                return found
        return None
    return path, _unserializable(value)


def _unserializable(culprit: Any) -> str:
    return (
        f"is not JSON-serializable: {type(culprit).__name__} value {culprit!r:.80}. "
        "Task arguments and return values must survive a JSON round trip; pass ids or "
        "plain data instead"
    )


def _refuse(path: str, problem: str) -> ArgumentsNotSerializable:
    return ArgumentsNotSerializable(f"{_short(path)} {problem}.")


def to_json(value: Any, what: str) -> str:
    """Dump `value` strictly (finite numbers, string keys, storable text) or name the culprit."""
    bad = _find_bad(value, what)
    if bad is not None:
        raise _refuse(*bad)
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:  # A subclass that lies, say.
        raise ArgumentsNotSerializable(f"{what} is not JSON-serializable: {exc}.") from exc
    # ensure_ascii escapes NUL as \u0000 and lone surrogates as \udXXX: if the
    # text has neither, nothing in it can be refused (the common case: one scan).
    if "\\u0000" in text or "\\ud" in text:
        bad = _find_bad(json.loads(text), what)  # Plain values now: look precisely.
        if bad is not None:
            raise _refuse(*bad)
    return text


# Values a JSON round trip gives back unchanged (floats may be NaN: not here).
_UNCHANGED = frozenset({type(None), str, int, bool})


def json_round_trip(value: Any, what: str) -> Any:
    """What the handler will receive: the value after a JSON dump and load."""
    kind = type(value)
    if kind in _UNCHANGED:
        if kind is str and (problem := text_problem(value)):
            raise _refuse(what, problem)
        return value  # The common return values of handlers, without the round trip.
    if (kind is list or kind is dict) and not value:
        return kind()  # No arguments (most calls' kwargs): nothing to look at.
    # Flat arguments (ids, names, flags) come back equal from a round trip:
    # copy them instead, as the round trip would have.
    if kind is list and all(type(item) in _UNCHANGED for item in value):
        _check_texts(enumerate(value), what)
        return list(value)
    if kind is dict and all(
        type(key) is str and type(item) in _UNCHANGED for key, item in value.items()
    ):
        _check_texts(((repr(k), k) for k in value), what, keys=True)
        _check_texts(((repr(k), v) for k, v in value.items()), what)
        return dict(value)
    return json.loads(to_json(value, what))


def _check_texts(items: Iterable[tuple[Any, Any]], what: str, *, keys: bool = False) -> None:
    """The strings of a flat list or dict are storable (one scan each; others pass)."""
    for index, item in items:
        if type(item) is str and (problem := text_problem(item)):
            raise _refuse(f"{what} key {item!r:.40}" if keys else f"{what}[{index}]", problem)


def loaded(value: Any) -> Any:
    """A jsonb value as Python: Django's cursors hand it over as text, psycopg's decoded."""
    return json.loads(value) if isinstance(value, str) else value
