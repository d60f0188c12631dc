"""System checks for the API and metrics settings (no optional extra needed)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from django.core import checks

from ..conf import raw_settings
from .allowlist import build, entry_problem


def check_api_settings(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    raw = raw_settings()
    entries = raw.get("API_TASKS", ())
    if isinstance(entries, list | tuple):
        malformed = [p for e in entries if (p := entry_problem(e))]
        for problem in malformed:
            yield checks.Error(
                f"CONVEYOR['API_TASKS']: {problem}",
                hint="List task paths such as 'shop.tasks.send_receipt' or 'shop.tasks.*'.",
                id="conveyor.E030",
            )
        if not malformed:
            for problem in build(tuple(entries)).problems:
                yield checks.Error(f"CONVEYOR['API_TASKS']: {problem}", id="conveyor.E031")
    # API_MAX_BODY_BYTES's bound (conveyor.E032) is declared with the setting in conf.py.
    addresses = raw.get("METRICS_ALLOWED_ADDRESSES", ())
    if isinstance(addresses, list | tuple):
        networks = []
        for address in addresses:
            try:
                if not isinstance(address, str):
                    raise TypeError(address)
                networks.append(ipaddress.ip_network(address, strict=False))
            except (TypeError, ValueError):
                yield checks.Error(
                    f"CONVEYOR['METRICS_ALLOWED_ADDRESSES'] holds {address!r}, which is not an "
                    "IP address or network.",
                    hint="Use addresses or CIDR networks such as '10.0.0.5' or '10.0.0.0/24'.",
                    id="conveyor.E033",
                )
        if everyone := _every_address(networks):
            yield checks.Warning(
                f"CONVEYOR['METRICS_ALLOWED_ADDRESSES'] lets every {everyone} address scrape "
                "the metrics without a key: anyone who reaches the site reads every queue's "
                "counts and names.",
                hint="List your Prometheus servers' addresses or networks, or send a key with "
                "the 'metrics' scope and leave the list empty.",
                id="conveyor.W034",
            )


def _every_address(networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    """ "IPv4", "IPv6" or both when the networks together cover every address, else ""."""
    covered = [
        name
        for version, name in ((4, "IPv4"), (6, "IPv6"))
        if any(
            whole.prefixlen == 0
            for whole in ipaddress.collapse_addresses(n for n in networks if n.version == version)
        )
    ]
    return " and ".join(covered)
