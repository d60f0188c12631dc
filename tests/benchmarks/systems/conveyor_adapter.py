"""Benchmark adapter entry point (runs inside its own virtualenv)."""

from __future__ import annotations

import bench_common
import djsystems

if __name__ == "__main__":
    bench_common.main(djsystems.ConveyorAdapter)
