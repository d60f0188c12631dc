"""The effect ledger: an audit trail of effects applied under a fencing token.

An entry is written inside `context.atomic()` (`JobContext.record_effect`
checks that), so it commits with the handler's own writes and the job's
completion, or not at all. The unique (job, effect key) constraint refuses a
second application of one effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.utils import timezone

from .exceptions import EffectAlreadyApplied

if TYPE_CHECKING:
    from .models import LedgerEntry

MAX_EFFECT_KEY_LENGTH = 255

__all__ = ["EffectAlreadyApplied", "record_effect"]


def record_effect(
    *, database: str, job_id: int, lease_version: int, worker: str, effect_key: str
) -> LedgerEntry:
    """Insert one ledger entry in the caller's (guarded) transaction."""
    from .models import LedgerEntry

    if not effect_key or len(effect_key) > MAX_EFFECT_KEY_LENGTH:
        raise ValueError(
            f"effect_key must be a non-empty string of at most {MAX_EFFECT_KEY_LENGTH} characters."
        )
    try:
        with transaction.atomic(using=database):
            return LedgerEntry.objects.using(database).create(
                job_id=job_id,
                effect_key=effect_key,
                lease_version=lease_version,
                worker=worker,
                applied_at=timezone.now(),
            )
    except IntegrityError as exc:
        raise EffectAlreadyApplied(
            f"Effect {effect_key!r} of job {job_id} is already in the ledger."
        ) from exc
