#!/usr/bin/env python3
"""A TCP relay in front of one daemon that delays every chunk by a fixed time in each direction:
bench_scale.py's stand-in for ``tc netem delay`` on the node's link, which this machine's kernel lacks (no
``sch_netem``, no ``sch_fq`` for an EDT delay). It also counts what it relays.

Usage: ``scale_delay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS SLOW_MS STATS_FILE``. It
runs in the node's network namespace, listens on the node's LAN address and relays to the daemon on the
namespace's loopback. Every chunk read from either side is written to the other ``DELAY_MS`` after it
arrived, in order, so a request and its answer cross it with ``2 x DELAY_MS`` added: the round trip between
two nodes whose links each delay their outgoing packets by ``DELAY_MS``, as netem on every link would give.
A new connection's first chunk goes no earlier than ``3 x DELAY_MS`` after the accept (the handshake's round
trip, then the data's way). SIGUSR1 switches to ``SLOW_MS`` (a slow node: ``2 x SLOW_MS`` per round trip),
SIGUSR2 back.

Counting: a client chunk that starts an HTTP request starts a new exchange on its connection; ``GET
/llmman/node`` (a peer's probe or background refresh) is counted as a probe, anything else as other traffic,
and the bytes that follow in both directions, until the next request on that connection, go to the same
kind. The counters are written as JSON to ``STATS_FILE`` twice a second (``t`` is the time of writing,
``time.time()``).

Standard library only (uvloop when installed), so it costs the CPU as little as a Python relay can.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
import time
from typing import Any, cast

STARTS = (b"GET ", b"POST ", b"HEAD ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ")
PROBE = b"GET /llmman/node"
EOF = object()
CLOSE = object()


class Relay:
    """The shared state: delays and counters."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, slow: float) -> None:
        self.loop = loop
        self.normal, self.slow = delay, slow
        self.delay = delay
        self.counts: dict[str, int] = collections.defaultdict(int)
        self.open: set[asyncio.BaseTransport] = set()  # every connection, closed when the relay stops
        self.others: dict[str, int] = collections.defaultdict(int)  # other requests by line (50 kept)

    def stats(self) -> dict[str, Any]:
        """The counters as the stats file shows them."""
        return {"t": time.time(), "delay_ms": self.delay * 1000, **self.counts, "other_lines": self.others}


class Delayed:
    """One direction of one connection: items written to ``transport`` in order, each at its due time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: collections.deque[tuple[float, object]] = collections.deque()
        self.handle: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def attach(self, transport: asyncio.Transport) -> None:
        """Start writing to ``transport`` (what was queued meanwhile goes first)."""
        self.transport = transport
        self._arm()

    def push(self, due: float, item: object) -> None:
        """Write ``item`` (bytes, EOF or CLOSE) at loop time ``due`` (no earlier than what is queued)."""
        if self.queue:
            due = max(due, self.queue[-1][0])
        self.queue.append((due, item))
        self._arm()

    def _arm(self) -> None:
        if self.handle is None and self.transport is not None and self.queue:
            self.handle = self.loop.call_at(self.queue[0][0], self._flush)

    def _flush(self) -> None:
        self.handle = None
        transport = self.transport
        assert transport is not None
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now + 1e-4:
            _, item = self.queue.popleft()
            if item is EOF:
                if transport.can_write_eof() and not transport.is_closing():
                    transport.write_eof()
            elif item is CLOSE:
                transport.close()
            elif not transport.is_closing():
                assert isinstance(item, bytes)
                transport.write(item)
        self._arm()


class Upstream(asyncio.Protocol):
    """The relay's connection to the daemon: what it sends goes back to the client, delayed."""

    def __init__(self, inbound: Inbound) -> None:
        self.inbound = inbound

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inbound.relay.open.add(transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.inbound.count("out", len(data))
        self.inbound.down.push(self.inbound.relay.loop.time() + self.inbound.relay.delay, data)

    def eof_received(self) -> bool:
        self.inbound.down.push(self.inbound.relay.loop.time() + self.inbound.relay.delay, EOF)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.inbound.relay.open.discard(self.transport)
        self.inbound.down.push(self.inbound.relay.loop.time() + self.inbound.relay.delay, CLOSE)


class Inbound(asyncio.Protocol):
    """One client connection (a peer or the benchmark's client), relayed to the daemon."""

    def __init__(self, relay: Relay, target: tuple[str, int]) -> None:
        self.relay = relay
        self.target = target
        self.up = Delayed(relay.loop)
        self.down = Delayed(relay.loop)
        self.kind = "other"
        self.accepted = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self.relay.open.add(transport)
        self.accepted = self.relay.loop.time()
        self.down.attach(transport)
        self.relay.counts["connections"] += 1
        self.relay.loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            upstream, _ = await self.relay.loop.create_connection(lambda: Upstream(self), *self.target)
        except OSError:
            self.transport.close()
            return
        self.up.attach(cast(asyncio.Transport, upstream))

    def count(self, direction: str, size: int) -> None:
        """Add ``size`` bytes to this exchange's kind, ``direction`` ``in`` (to the daemon) or ``out``."""
        self.relay.counts[f"{self.kind}_bytes_{direction}"] += size

    def data_received(self, data: bytes) -> None:
        if data.startswith(STARTS):
            self.kind = "probe" if data.startswith(PROBE) else "other"
            self.relay.counts[f"{self.kind}_requests"] += 1
            line = data[:data.find(b" HTTP/")][:80].decode(errors="replace")
            if self.kind == "other" and (line in self.relay.others or len(self.relay.others) < 50):
                self.relay.others[line] += 1
        self.count("in", len(data))
        now, delay = self.relay.loop.time(), self.relay.delay
        self.up.push(max(now + delay, self.accepted + 3 * delay), data)

    def eof_received(self) -> bool:
        self.up.push(self.relay.loop.time() + self.relay.delay, EOF)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.open.discard(self.transport)
        self.up.push(self.relay.loop.time() + self.relay.delay, CLOSE)


def write_stats(path: str, stats: dict[str, Any]) -> None:
    """Replace ``path`` with ``stats`` as JSON, in one rename (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(stats, f)
    os.replace(tmp, path)


async def serve(listen: tuple[str, int], target: tuple[str, int], delay: float, slow: float,
                stats: str) -> None:
    """Relay until killed, writing the counters to ``stats`` twice a second."""
    loop = asyncio.get_running_loop()
    relay = Relay(loop, delay, slow)

    def set_delay(value: float) -> None:
        relay.delay = value

    while True:  # listen only once the daemon does: before that a peer is refused, as by a real node
        try:
            _, writer = await asyncio.open_connection(*target)
        except OSError:
            await asyncio.sleep(0.05)  # polling for the daemon's port; the event is it accepting
            continue
        writer.close()
        break
    loop.add_signal_handler(signal.SIGUSR1, set_delay, slow)
    loop.add_signal_handler(signal.SIGUSR2, set_delay, delay)
    server = await loop.create_server(lambda: Inbound(relay, target), *listen, backlog=1024,
                                      reuse_address=True)
    try:
        async with server:
            while True:
                write_stats(stats, relay.stats())
                await asyncio.sleep(0.5)  # the stats file's period
    finally:
        for transport in list(relay.open):
            transport.close()


def main(argv: list[str]) -> int:
    """Parse the arguments and relay."""
    if len(argv) != 7:
        print(__doc__, file=sys.stderr)
        return 2
    listen_host, listen_port, target_host, target_port, delay_ms, slow_ms, stats = argv
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve((listen_host, int(listen_port)), (target_host, int(target_port)), float(delay_ms) / 1000,
                 float(slow_ms) / 1000, stats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
