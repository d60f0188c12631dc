"""API keys in the admin: listed (never their hash), revoked with an action.

Keys are created with `manage.py conveyor_api_key create`, which shows a key
once; the admin can only revoke.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ..api import keys
from ..models import ApiKey
from .base import ReadOnlyAdmin


@admin.action(permissions=["operate"], description="Revoke selected API keys")
def revoke_api_keys(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[ApiKey]
) -> None:
    revoked = [key for key in queryset if keys.revoke(key.prefix)]
    modeladmin.message_user(request, f"Revoked {len(revoked)} API key(s).", messages.SUCCESS)


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = ("name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("name", "=prefix")
    fields = ("name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    actions = [revoke_api_keys]
