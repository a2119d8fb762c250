"""An ASGI middleware (vLLM ``--middleware``) that stamps responses with the weight version.

It also names the answering engine (``x-vime-engine``), so session affinity is observable.

Every HTTP response of an engine carries ``x-vime-weight-version``: the engine's weight
version when the response starts. Vime changes weights only while an engine is paused in
``abort`` or ``wait`` mode and sets the new version before it resumes, so every request is
generated under exactly one version; a non-streaming response starts after its generation
has finished, and an update takes far longer than sending one response, so the stamp is the
version the tokens came from. ``/inference/v1/generate`` additionally returns vLLM's own
per-token ``weight_versions`` spans, which the client prefers when present.
"""

from __future__ import annotations

from typing import Any

HEADER = b"x-vime-weight-version"
ENGINE_HEADER = b"x-vime-engine"  # host:port of the engine that answered


class WeightVersionMiddleware:
    """Adds ``x-vime-weight-version`` to every HTTP response of a vLLM API server."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._engine: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """ASGI entry point."""
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        app_state = scope.get("app").state if scope.get("app") is not None else None
        server = scope.get("server") or ("", 0)
        engine = f"{server[0]}:{server[1]}".encode()

        async def stamped_send(message: dict) -> None:
            if message.get("type") == "http.response.start":
                version = await self._version(app_state)
                headers = [*message.get("headers", []), (ENGINE_HEADER, engine)]
                if version is not None:
                    headers.append((HEADER, version.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped_send)

    async def _version(self, app_state: Any) -> str | None:
        engine = getattr(app_state, "engine_client", None)
        if engine is None:
            return None
        try:
            return str(await engine.get_weight_version())
        except Exception:  # an engine that is shutting down has no version to report
            return None
