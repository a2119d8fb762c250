"""Sandboxes: run model-written code safely (``local`` bubblewrap, ``docker``, ``remote``).

``vime.sandboxes.create(backend, **options)`` returns a :class:`Sandbox`.
"""

from vime.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits
from vime.sandboxes.pool import SandboxPool
from vime.sandboxes.registry import available_backends, create, register_backend

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "available_backends",
    "create",
    "register_backend",
]
