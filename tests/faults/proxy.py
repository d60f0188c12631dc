"""A TCP fault proxy on loopback: added latency and dropped connections.

Every chunk is held back `latency` seconds in each direction, in order (as
`tc netem delay` on loopback would). Each connection is doomed with
probability `drop_rate` when it opens and again after every
`REROLL_SECONDS` it stays open (so long-lived control connections get no
immunity); a doomed connection is reset (RST, both sides) at a random
moment within `DROP_WINDOW_SECONDS`, possibly at once.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections import Counter
from contextlib import suppress

CHUNK = 65536
DROP_WINDOW_SECONDS = 1.0
REROLL_SECONDS = 1.0


class FaultProxy:
    def __init__(
        self, *, listen_port: int, upstream_port: int, latency: float, drop_rate: float, seed: int,
        listen_host: str = "127.0.0.1",
    ) -> None:  # fmt: skip
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.latency = latency
        self.drop_rate = drop_rate
        self.random = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self.server: asyncio.Server | None = None

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("The fault proxy did not start.")

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, self.listen_host, self.listen_port)
        )
        self.ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.server.close()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            with suppress(Exception):
                self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        with suppress(asyncio.CancelledError):  # Cancelled at stop: end quietly.
            await self._relay(client_r, client_w)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.counts["connections"] += 1
        try:
            upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            self.counts["upstream_unreachable"] += 1
            _reset(client_w)
            return
        pipes = [
            asyncio.ensure_future(self._pipe(client_r, upstream_w)),
            asyncio.ensure_future(self._pipe(upstream_r, client_w)),
        ]
        doom = asyncio.ensure_future(self._doom())
        done, _ = await asyncio.wait([*pipes, doom], return_when=asyncio.FIRST_COMPLETED)
        if doom in done:
            self.counts["dropped"] += 1
            _reset(client_w)
            _reset(upstream_w)
        else:
            for writer in (client_w, upstream_w):
                with suppress(Exception):
                    writer.close()
        for task in [*pipes, doom]:
            task.cancel()

    async def _doom(self) -> None:
        """Return when this connection is to be dropped; never, for most."""
        if self.drop_rate <= 0:  # A pure latency relay: nothing to draw.
            await asyncio.Event().wait()
        while True:
            if self.random.random() < self.drop_rate:
                await asyncio.sleep(self.random.uniform(0, DROP_WINDOW_SECONDS))
                return
            self.counts["drop_draws"] += 1
            await asyncio.sleep(REROLL_SECONDS)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk delivered `latency` after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    with suppress(Exception):
                        writer.write_eof()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + self.latency, data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: the peer sees a dropped connection."""
    sock = writer.get_extra_info("socket")
    with suppress(Exception):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
