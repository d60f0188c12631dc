"""argparse `type=` validators shared by the management commands.

Each returns the parsed value or raises `ArgumentTypeError` with a message
that names the problem; argparse adds the flag's name and exits with 2.
"""

from __future__ import annotations

import argparse
import math

MAX_WORKER_ID_LENGTH = 64
MAX_PORT = 65535


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1 to {MAX_PORT}, got {value}")
    return value


def non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = non_negative_seconds(text)
    if value == 0:
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
