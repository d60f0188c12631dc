"""Who is calling: an API key with scopes, or a staff session with Django permissions.

A request with an `Authorization` header is judged by its key alone (a bad
key is 401 even if a session cookie rides along) and is CSRF-exempt: a
browser never adds that header by itself. A request without one may use a
staff session, for the read and operate endpoints only, and then passes
Django's CSRF check on every unsafe method, as any form of the site does.
The key is never logged, and never kept beyond the check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.views.decorators.debug import sensitive_variables
from ninja.errors import AuthorizationError
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from . import keys

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Caller:
    actor: str  # Recorded with the writes it makes: "api:<key name>" or "admin:<username>".
    key_name: str | None = None


class ApiKeyAuth(HttpBearer):
    """`Authorization: Bearer <key>` with the endpoint's scope."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__()

    @sensitive_variables("header", "raw")
    def __call__(self, request: HttpRequest) -> Caller | None:
        # Not HttpBearer.__call__: it logs an unexpected header (with the key) under DEBUG.
        header = request.headers.get("Authorization")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return None
        return self.authenticate(request, raw.strip())

    @sensitive_variables("token")
    def authenticate(self, request: HttpRequest, token: str) -> Caller | None:
        key = keys.authenticate(token)
        if key is None:
            return None
        if self.scope not in key.scopes:
            raise AuthorizationError(
                message=f"The API key {key.name!r} does not have the {self.scope!r} scope."
            )
        return Caller(actor=f"api:{key.name}", key_name=key.name)


class StaffSessionAuth(APIKeyCookie):
    """A logged-in staff user with `permission`; CSRF-checked on unsafe methods."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, permission: str) -> None:
        self.permission = permission
        super().__init__(csrf=True)

    def _get_key(self, request: HttpRequest) -> str | None:
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: Any) -> Caller | None:
        user = getattr(request, "user", None)
        if "Authorization" in request.headers or user is None or not user.is_authenticated:
            return None
        if not (user.is_active and user.is_staff):
            raise AuthorizationError(message="Only staff users may use the API with a session.")
        if request.method not in SAFE_METHODS and check_csrf(request):
            raise AuthorizationError(
                message="CSRF check failed: send the X-CSRFToken header with a session, "
                "or use an API key."
            )
        if not user.has_perm(self.permission):
            raise AuthorizationError(
                message=f"User {user.get_username()!r} lacks the permission {self.permission!r}."
            )
        return Caller(actor=f"admin:{user.get_username()}")


def credentials(scope: str, permission: str | None = None) -> list[Any]:
    """The auth of an endpoint: a key with `scope`, or a staff session with `permission`."""
    auth: list[Any] = [ApiKeyAuth(scope)]
    if permission is not None:
        auth.append(StaffSessionAuth(permission))
    return auth
