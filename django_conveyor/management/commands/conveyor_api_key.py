"""`manage.py conveyor_api_key create|list|revoke`: keys for the HTTP API and the metrics."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_conveyor.api import keys
from django_conveyor.models import API_SCOPES


def scope_list(text: str) -> list[str]:
    try:
        return keys.parse_scopes(text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = "Create, list or revoke API keys (the key is printed once, at creation)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="Create a key and print it once.")
        create.add_argument("name", help="Who uses the key; writes record the actor api:<name>.")
        create.add_argument(
            "--scopes",
            type=scope_list,
            required=True,
            help=f"Comma-separated scopes: {', '.join(API_SCOPES)}.",
        )
        actions.add_parser("list", help="List keys: name, prefix, scopes, created, last used.")
        revoke = actions.add_parser("revoke", help="Revoke the live key with this name or prefix.")
        revoke.add_argument("key", help="The key's name or its public prefix.")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"handle_{options['action']}")(options)

    def handle_create(self, options: dict[str, Any]) -> None:
        try:
            key, raw = keys.create(options["name"], options["scopes"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"Created API key {key.name!r} (prefix {key.prefix}) with scopes "
            f"{', '.join(key.scopes)}. It is shown once; store it now."
        )
        self.stdout.write(raw)

    def handle_list(self, options: dict[str, Any]) -> None:
        listed = keys.listed()
        if not listed:
            self.stdout.write("No API keys.")
            return
        self.stdout.write("name\tprefix\tscopes\tcreated\tlast used\trevoked")
        for key in listed:
            self.stdout.write(
                "\t".join(
                    [
                        key.name,
                        key.prefix,
                        ",".join(key.scopes),
                        _when(key.created_at),
                        _when(key.last_used_at),
                        _when(key.revoked_at),
                    ]
                )
            )

    def handle_revoke(self, options: dict[str, Any]) -> None:
        revoked = keys.revoke(options["key"])
        if not revoked:
            raise CommandError(f"No live API key has the name or prefix {options['key']!r}.")
        for key in revoked:
            self.stdout.write(f"Revoked API key {key.name!r} (prefix {key.prefix}).")


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else "-"
