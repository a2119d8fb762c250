"""A pool of warm sandboxes: one fresh sandbox per episode, prepared ahead of time, and a limit
on how many are in use at once. Works with every backend."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from vime.sandboxes.base import Sandbox, SandboxError
from vime.sandboxes.registry import create

logger = logging.getLogger(__name__)


class SandboxPool:
    """Hands out started sandboxes of one kind, each for a single episode.

    ``backend`` is a backend name (with ``options`` for :func:`vime.sandboxes.create`) or a
    zero-argument factory. ``warm`` sandboxes are kept started and idle so an episode does
    not wait for set-up; at most ``max_concurrent`` are in use at once (further ``acquire``
    calls wait). A released sandbox is closed, never reused, so no state leaks between
    episodes::

        async with SandboxPool("local", warm=4, max_concurrent=32) as pool:
            async with pool.acquire() as box:
                await box.run_code("print(1)")
    """

    def __init__(
        self,
        backend: str | Callable[[], Sandbox] = "local",
        *,
        warm: int = 2,
        max_concurrent: int = 32,
        **options: Any,
    ) -> None:
        if warm < 0:
            raise ValueError(f"warm must be >= 0, got {warm}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        if callable(backend) and options:
            raise ValueError("pass options to your factory, not to SandboxPool, when it is one")
        self._factory: Callable[[], Sandbox] = (
            backend if callable(backend) else lambda: create(backend, **options)
        )
        self.warm = warm
        self.max_concurrent = max_concurrent
        self._slots = asyncio.Semaphore(max_concurrent)
        self._idle: list[Sandbox] = []
        self._filling: set[asyncio.Task[None]] = set()
        self.in_use = 0
        self.created = 0
        self.closed = False

    async def _new(self) -> Sandbox:
        box = self._factory()
        self.created += 1
        try:
            await box.start()
        except BaseException:
            await box.close()
            raise
        return box

    async def _fill_one(self) -> None:
        try:
            box = await self._new()
        except Exception as exc:  # the next acquire creates one itself and raises the error
            logger.warning("could not prepare a warm sandbox: %s", exc)
            return
        if self.closed:
            await box.close()
        else:
            self._idle.append(box)

    def _refill(self) -> None:
        """Start preparing sandboxes until ``warm`` are idle or on their way."""
        while not self.closed and len(self._idle) + len(self._filling) < self.warm:
            task = asyncio.create_task(self._fill_one())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)

    async def start(self) -> None:
        """Prepare the warm sandboxes now (``acquire`` also works without this)."""
        self._refill()
        if self._filling:
            await asyncio.gather(*self._filling)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Sandbox]:
        """A started sandbox for one episode; it is closed when the block ends."""
        if self.closed:
            raise SandboxError("this SandboxPool is closed; create a new one")
        async with self._slots:
            box = self._idle.pop() if self._idle else await self._new()
            self.in_use += 1
            self._refill()
            try:
                yield box
            finally:
                self.in_use -= 1
                await box.close()

    async def close(self) -> None:
        """Close the idle sandboxes and stop preparing new ones. Idempotent.

        Sandboxes still in use are closed by their own ``acquire`` block.
        """
        self.closed = True
        if self._filling:
            await asyncio.gather(*self._filling, return_exceptions=True)
        idle, self._idle = self._idle, []
        await asyncio.gather(*(box.close() for box in idle), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
