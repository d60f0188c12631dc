"""argparse `type=` validators shared by the management commands.

Each returns the parsed value or raises `ArgumentTypeError` with a message
that names the problem; argparse adds the flag's name and exits with 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from django_conveyor.bounds import MAX_INT, MAX_PORT, MAX_SECONDS, Breach, breach, seconds_breach

MAX_WORKER_ID_LENGTH = 64


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    broken = breach(value, minimum=1, maximum=MAX_INT)
    if broken is Breach.BELOW:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    if broken is Breach.ABOVE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INT}, got {value}")
    return value


def int_up_to(maximum: int) -> Callable[[str], int]:
    """A whole number from 1 to `maximum`."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if breach(value, maximum=maximum):
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if breach(value, minimum=1, maximum=MAX_PORT):
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to {MAX_PORT}, got {value}")
    return value


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    broken = seconds_breach(value, zero=True)
    if broken is Breach.NOT_A_NUMBER:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text}")
    if broken is Breach.BELOW:
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text}")
    if broken is Breach.ABOVE:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_SECONDS:.0f} seconds (ten years), got {text}"
        )
    return value


def positive_seconds(text: str) -> float:
    value = non_negative_seconds(text)
    if seconds_breach(value):  # Only zero is left to refuse.
        raise argparse.ArgumentTypeError("must be more than zero seconds")
    return value


def queue_list(text: str) -> list[str]:
    queues = [q.strip() for q in text.split(",") if q.strip()]
    if not queues:
        raise argparse.ArgumentTypeError("expected a comma-separated list of queue names")
    return queues


def worker_id(text: str) -> str:
    if not text or len(text) > MAX_WORKER_ID_LENGTH:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_WORKER_ID_LENGTH} characters")
    return text
