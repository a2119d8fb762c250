"""Connection limits of the sandbox server: a deadline for each request head, an idle limit
between requests, and a cap on open connections, so idle or slow clients cannot starve it."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

Handler = Any  # aiohttp's RequestHandler (one per connection)
_FDS_PER_CALL = 8  # descriptors a running call holds (pipes, pidfd, seccomp filter)
_FDS_SPARE = 64  # the rest of the process: log files, the engine socket
ACCEPT_BACKLOG = 128  # the listen queue, and how many sockets asyncio accepts per wake-up
# asyncio accepts a batch, makes its transports one loop turn later and reports them to the
# guard the turn after; a socket the guard closes is released one turn after that. So up to
# three batches are open beyond the cap; past the fd limit asyncio stops accepting for 1 s.
_FDS_ACCEPTING = 3 * ACCEPT_BACKLOG


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit; returns the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def connection_budget(wanted: int, max_concurrency: int) -> int:
    """How many connections may be open: ``wanted``, or fewer where the fd limit is lower."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    room = limit - _FDS_SPARE - _FDS_ACCEPTING - _FDS_PER_CALL * max_concurrency
    if room < wanted:
        logger.warning(
            "the open-file limit (%d) leaves room for %d connections, not %d: raise it "
            "(ulimit -n) to serve more clients at once",
            limit,
            max(room, 1),
            wanted,
        )
    return max(1, min(wanted, room))


class ConnectionGuard:
    """Watches the connections of one aiohttp server and closes the ones that overstay.

    A connection is *idle* from its accept, or from the end of its previous request, until
    the server starts handling its next request (i.e. its head has arrived). A fresh
    connection may stay idle ``header_timeout`` seconds, a reused one ``keepalive_timeout``;
    bytes trickling in do not extend either (a slow head is an idle connection). When
    ``max_connections`` are open, a new one closes the longest idle one; if none is idle, the
    new one is closed.
    """

    def __init__(
        self, *, header_timeout: float, keepalive_timeout: float, max_connections: int
    ) -> None:
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.max_connections = max_connections
        self._transports: dict[Handler, asyncio.Transport] = {}
        self._idle: dict[Handler, tuple[float, float]] = {}  # handler -> (since, allowed)
        self._watch: asyncio.Task[None] | None = None
        self.closed_idle = 0  # connections closed for overstaying or for room (for tests, stats)

    def install(self, server: web.Server) -> None:
        """Follow ``server``'s connections: aiohttp's protocol reports each one opening and
        closing to its server, so the guard wraps those two hooks."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Handler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler: Handler, exc: BaseException | None = None) -> None:
            self._transports.pop(handler, None)
            self._idle.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]
        self._watch = asyncio.create_task(self._watch_idle())

    def stop(self) -> None:
        """Stop watching (at server shutdown)."""
        if self._watch is not None:
            self._watch.cancel()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Marks the connection busy while its request is handled."""
        protocol = request.protocol
        self._idle.pop(protocol, None)
        try:
            return await handler(request)
        finally:
            if protocol in self._transports:
                now = asyncio.get_running_loop().time()
                self._idle[protocol] = (now, self.keepalive_timeout)

    def _opened(self, handler: Handler, transport: asyncio.Transport) -> None:
        now = asyncio.get_running_loop().time()
        self._transports[handler] = transport
        self._idle[handler] = (now, self.header_timeout)
        if len(self._transports) > self.max_connections:
            # The longest idle goes; a new connection is the newest idle, so it goes last.
            oldest = min(self._idle, key=lambda h: self._idle[h][0])
            self._close(oldest)

    def _close(self, handler: Handler) -> None:
        self.closed_idle += 1
        self._idle.pop(handler, None)
        transport = self._transports.pop(handler, None)
        if transport is not None:
            transport.close()

    async def _watch_idle(self) -> None:
        period = max(0.05, min(self.header_timeout, self.keepalive_timeout) / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for handler, (since, allowed) in list(self._idle.items()):
                if now - since > allowed:
                    self._close(handler)
