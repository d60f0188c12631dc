"""Tags and metadata of a job: how they combine, and what the edge refuses.

Both are stored as NULL when empty (never `{}` or `[]`), so a job without
them has no entry in their partial indexes (docs/observability.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..exceptions import ArgumentsNotSerializable
from ..serialization import json_round_trip, text_problem

MAX_TAGS = 32
MAX_TAG_LENGTH = 64
MAX_META_BYTES = 4096
TRACE_KEYS = ("traceparent", "tracestate")


def combined_tags(*groups: Iterable[str] | None) -> tuple[str, ...]:
    """The tags of each group in order, duplicates dropped (a task's, then a call's)."""
    return tuple(dict.fromkeys(tag for group in groups if group for tag in group))


def tags_problem(tags: Any) -> str | None:
    """What is wrong with a job's tags, as a sentence naming the value, or None."""
    if isinstance(tags, str) or not isinstance(tags, list | tuple):
        return f"tags must be a list of strings, not {type(tags).__name__} {tags!r:.80}."
    if len(tags) > MAX_TAGS:
        return f"A job has at most {MAX_TAGS} tags, not {len(tags)}."
    for tag in tags:
        if not isinstance(tag, str):
            return f"Each tag must be a string, not {type(tag).__name__} {tag!r:.40}."
        if problem := text_problem(tag):
            return f"Tag {tag!r:.40} {problem}."
        if not tag.strip() or len(tag) > MAX_TAG_LENGTH:
            return (
                f"Each tag must be 1 to {MAX_TAG_LENGTH} characters and not only spaces, "
                f"not {tag!r:.80}."
            )
    return None


def meta_problem(meta: Any) -> str | None:
    """What is wrong with a job's metadata, as a sentence naming the value, or None."""
    if not isinstance(meta, dict):
        return f"meta must be a dict (a JSON object), not {type(meta).__name__} {meta!r:.80}."
    try:
        value = json_round_trip(meta, "meta")
    except ArgumentsNotSerializable as exc:
        return str(exc)
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_META_BYTES:
        return f"meta must be at most {MAX_META_BYTES} bytes as JSON, not {size}."
    for key in TRACE_KEYS:
        if key in value and not isinstance(value[key], str):
            return f"meta[{key!r}] is trace context: a string, not {value[key]!r:.80}."
    return None
