"""Vime: environment-centric agentic RL for LLMs, in the Gym style.

The names below load lazily so that ``import vime`` stays fast and never pulls in torch,
vllm or ray; importing it registers the built-in envs with gymnasium.
"""

from __future__ import annotations

from vime.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "Env": "vime.envs.base",
    "ToolEnv": "vime.envs.base",
    "tool": "vime.envs.tools",
    "heavy": "vime.envs.grading",
    "Tool": "vime.envs.tools",
    "make": "vime.envs.registry",
    "register": "vime.envs.registry",
    "Trajectory": "vime.types",
    "Status": "vime.types",
    "ToolCall": "vime.types",
    "Message": "vime.types",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_exports(__name__, _LAZY, globals())

# Register the built-in env ids with gymnasium, so that gymnasium.make("vime/Math-v0") works
# after `import vime` alone (gymnasium has no plugin discovery). It costs importing gymnasium.
import vime.envs  # noqa: E402, F401
