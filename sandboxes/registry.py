"""Backend registry and the ``create`` factory."""

from __future__ import annotations

import importlib
from typing import Any

from vime.sandboxes.base import Sandbox

# name -> "module:Class"; imported on first use so docker/httpx load only when needed.
_BACKENDS: dict[str, str] = {
    "local": "vime.sandboxes.local:LocalSandbox",
    "docker": "vime.sandboxes.docker:DockerSandbox",
    "remote": "vime.sandboxes.remote:RemoteSandbox",
}


def register_backend(name: str, target: str) -> None:
    """Register a backend class given as ``"module:Class"``."""
    _BACKENDS[name] = target


def available_backends() -> list[str]:
    """Names of the registered backends."""
    return sorted(_BACKENDS)


def backend_class(name: str) -> type[Sandbox]:
    """The class of backend ``name``, with a clear error for unknown names."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {available_backends()}")
    module, cls = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def create(backend: str = "local", **options: Any) -> Sandbox:
    """Create a sandbox of ``backend``; ``options`` are the backend's and the limits' keywords."""
    return backend_class(backend)(**options)
