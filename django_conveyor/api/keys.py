"""API keys: made once, stored as a hash, checked in constant time.

A key reads `cvk_<prefix>_<secret>`: the prefix (8 characters, public, shown
by `conveyor_api_key list`) finds the row; the secret (32 random bytes) is
never stored. The table keeps the SHA-256 of the whole key. A fast hash is
right here, unlike for passwords: the secret is 256 random bits, so nothing
can be guessed from its hash, and every API request pays for the check.

This module needs no optional extra: the management command uses it on a
site that never installed `django-conveyor[api]`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import conveyor_settings
from ..models import API_SCOPES, ApiKey

KEY_PREFIX = "cvk"
PREFIX_LENGTH = 8
SECRET_BYTES = 32
# last_used_at is written at most this often per key, so that a busy key
# does not turn every API request into a write.
LAST_USED_RESOLUTION_SECONDS = 60.0
MAX_NAME_LENGTH = 100

_KEY_PATTERN = re.compile(
    rf"^{KEY_PREFIX}_([a-z0-9]{{{PREFIX_LENGTH}}})_([A-Za-z0-9_-]{{20,128}})$"
)
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
# Compared against when no row matches, so a wrong prefix costs the same as a wrong secret.
_NO_HASH = "0" * 64


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def parse_scopes(scopes: Iterable[str]) -> list[str]:
    """The scopes in their canonical order; ValueError names an unknown one."""
    wanted = {s.strip() for s in scopes if s.strip()}
    unknown = sorted(wanted - set(API_SCOPES))
    if unknown:
        raise ValueError(
            f"Unknown scope(s) {', '.join(unknown)}; choose from {', '.join(API_SCOPES)}."
        )
    if not wanted:
        raise ValueError(f"Give at least one scope: {', '.join(API_SCOPES)}.")
    return [s for s in API_SCOPES if s in wanted]


def check_name(name: str) -> str:
    if not (0 < len(name) <= MAX_NAME_LENGTH) or not _NAME_PATTERN.match(name):
        raise ValueError(
            f"A key name is 1 to {MAX_NAME_LENGTH} letters, digits or _.@- and starts with a "
            f"letter or digit, not {name!r}."
        )
    return name


def new_raw_key() -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    prefix = "".join(secrets.choice(alphabet) for _ in range(PREFIX_LENGTH))
    return f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"


def create(name: str, scopes: Sequence[str], *, raw_key: str | None = None) -> tuple[ApiKey, str]:
    """Store a new key and return it with its only clear copy.

    `raw_key` is for fixtures such as the example shop's demo key; leave it
    out anywhere else, so that the key comes from `secrets`.
    """
    raw = raw_key or new_raw_key()
    match = _KEY_PATTERN.match(raw)
    if match is None:
        raise ValueError(f"A key reads {KEY_PREFIX}_<8 lowercase letters or digits>_<secret>.")
    key = ApiKey(
        name=check_name(name),
        prefix=match.group(1),
        secret_hash=hash_key(raw),
        scopes=parse_scopes(scopes),
        created_at=timezone.now(),
    )
    try:
        with transaction.atomic(using=conveyor_settings().DATABASE):
            key.save(using=conveyor_settings().DATABASE)
    except IntegrityError:
        raise ValueError(
            f"A live key named {name!r} exists; revoke it or choose another name."
        ) from None
    return key, raw


def authenticate(raw: str) -> ApiKey | None:
    """The live key that `raw` is, or None; never says which part was wrong."""
    match = _KEY_PATTERN.match(raw)
    prefix = match.group(1) if match else ""
    key = (
        ApiKey.objects.using(conveyor_settings().DATABASE)
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
        if match
        else None
    )
    stored = key.secret_hash if key is not None else _NO_HASH
    if not hmac.compare_digest(stored, hash_key(raw)) or key is None:
        return None
    _touch(key)
    return key


def _touch(key: ApiKey) -> None:
    now = timezone.now()
    resolution = timedelta(seconds=LAST_USED_RESOLUTION_SECONDS)
    if key.last_used_at is None or now - key.last_used_at >= resolution:
        ApiKey.objects.using(conveyor_settings().DATABASE).filter(pk=key.pk).update(
            last_used_at=now
        )
        key.last_used_at = now


def revoke(name_or_prefix: str) -> list[ApiKey]:
    """Revoke the live keys with this name or prefix; returns those revoked."""
    database = conveyor_settings().DATABASE
    with transaction.atomic(using=database):
        live = ApiKey.objects.using(database).select_for_update().filter(revoked_at__isnull=True)
        keys = list(live.filter(name=name_or_prefix)) or list(live.filter(prefix=name_or_prefix))
        now = timezone.now()
        ApiKey.objects.using(database).filter(pk__in=[k.pk for k in keys]).update(revoked_at=now)
        for key in keys:
            key.revoked_at = now
    return keys


def listed() -> list[ApiKey]:
    return list(ApiKey.objects.using(conveyor_settings().DATABASE).order_by("name", "id"))
