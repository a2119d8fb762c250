"""The sandbox of one episode: made on first use, closed when the episode ends (envs that run
model-written code hold one)."""

from __future__ import annotations

import logging
from typing import Any

from vime.sandboxes import Sandbox, create
from vime.sandboxes.registry import backend_class

logger = logging.getLogger(__name__)


class EpisodeSandbox:
    """Lazily creates a sandbox of ``backend`` (with ``options``) for the current episode.

    Nothing is started until the episode first runs code, so episodes that never do cost
    nothing. :meth:`close` ends it; the next :meth:`get` starts a fresh one, so no state
    leaks from one episode to the next.
    """

    def __init__(self, backend: str = "local", options: dict[str, Any] | None = None):
        backend_class(backend)  # an unknown backend fails when the env is made, not mid-episode
        self.backend = backend
        self.options = dict(options or {})
        self.box: Sandbox | None = None

    async def get(self) -> Sandbox:
        """The episode's sandbox, started on first use."""
        if self.box is None:
            box = create(self.backend, **self.options)
            try:
                await box.start()
            except BaseException:
                await box.close()
                raise
            self.box = box
        return self.box

    async def close(self) -> None:
        """Close the episode's sandbox, if one was started. Idempotent."""
        box, self.box = self.box, None
        if box is not None:
            try:
                await box.close()
            except Exception:
                # the episode is over either way; a failed cleanup must not fail the rollout
                logger.exception("closing the %s sandbox of an episode failed", self.backend)

    def __getstate__(self) -> dict[str, Any]:
        # a copy (pickled to a worker) starts its own sandbox; a live one is not transferable
        return {**self.__dict__, "box": None}
