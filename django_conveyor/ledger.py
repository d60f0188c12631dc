"""The effect ledger: an audit trail of effects applied under a fencing token.

An entry is written inside `context.atomic()`, so it commits with the
handler's own writes and the job's completion, or not at all. The unique
(job, effect key) constraint refuses a second application of one effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.utils import timezone

from .exceptions import ConveyorError

if TYPE_CHECKING:
    from .context import JobContext
    from .models import LedgerEntry


class EffectAlreadyApplied(ConveyorError):
    """The ledger already holds this effect for this job."""


def record_effect(context: JobContext, effect_key: str) -> LedgerEntry:
    from .models import LedgerEntry

    if not context.lease_state.in_atomic:
        raise RuntimeError("record_effect() must run inside context.atomic().")
    if not effect_key or len(effect_key) > 255:
        raise ValueError("effect_key must be a non-empty string of at most 255 characters.")
    try:
        with transaction.atomic(using=context.database):
            return LedgerEntry.objects.using(context.database).create(
                job_id=context.job_id,
                effect_key=effect_key,
                lease_version=context.token,
                worker=context.worker_id,
                applied_at=timezone.now(),
            )
    except IntegrityError as exc:
        raise EffectAlreadyApplied(
            f"Effect {effect_key!r} of job {context.job_id} is already in the ledger."
        ) from exc
