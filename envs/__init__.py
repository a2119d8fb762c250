"""Environments (``vime.envs``): the Env base class, tools, wrappers and the env registry.

Importing this package registers the built-in envs (``vime env list`` shows them).
"""

from vime.envs.base import Env, ToolEnv
from vime.envs.registry import make, register
from vime.envs.tools import tool

register("vime/Math-v0", "vime.envs.math_env:MathEnv")
register("vime/GuessNumber-v0", "vime.envs.guess_number:GuessNumberEnv")
register("vime/MathTool-v0", "vime.envs.math_tool:MathToolEnv")
register("vime/Code-v0", "vime.envs.code:CodeEnv")
register("vime/RepoFix-v0", "vime.envs.repofix.env:RepoFixEnv")
register("vime/CodeTool-v0", "vime.envs.code_tool:CodeToolEnv")
register("vime/ReasoningGym-v0", "vime.envs.reasoning_gym_env:ReasoningGymEnv")

__all__ = ["Env", "ToolEnv", "make", "register", "tool"]
