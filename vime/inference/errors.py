"""Errors of the inference layer, each naming what failed and what to do."""

from __future__ import annotations

from vime.errors import VimeError


class InferenceError(VimeError):
    """An engine, the router or a request failed."""


class EngineStartError(InferenceError):
    """An engine or the router did not become healthy; the message holds its log tail."""


class RequestAborted(InferenceError):
    """A request ended without a complete answer, on purpose or because its engine died.

    ``reason`` is a short machine-readable cause ("engine_died", "weight_update", "cancelled",
    "timeout", "server_error", "connection_lost", "client_error") and ``partial`` the raw
    response when there was one.
    """

    def __init__(self, reason: str, message: str, partial: object | None = None) -> None:
        super().__init__(f"request aborted ({reason}): {message}")
        self.reason = reason
        self.partial = partial


class ContextTooLong(InferenceError):
    """The prompt plus ``max_tokens`` does not fit the engine's ``--max-model-len``."""
