"""``vime/MathTool-v0``: multi-turn math where the model may run Python in a sandbox before it
answers in ``\\boxed{}`` (graded with math-verify, like ``vime/Math-v0``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vime.envs.base import StepResult, ToolEnv
from vime.envs.episode_sandbox import EpisodeSandbox
from vime.envs.math_env import MathEnv
from vime.envs.tools import tool
from vime.errors import EnvError
from vime.sandboxes import ExecResult
from vime.types import Message

SYSTEM_PROMPT = (
    "Solve the problem. You may call the `python` tool to run Python code; it returns what "
    "the program prints. When you are done, give your final answer in \\boxed{}."
)
# room the tool call gets beyond the code's own time limit: starting the episode's sandbox and
# killing a runaway program happen inside it
TOOL_TIMEOUT_MARGIN = 20.0


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def format_result(result: ExecResult, *, timeout: float, limit: int) -> str:
    """The tool message for a run: stdout, then ``[stderr]``, the exit code or the timeout."""
    parts = [clip(result.stdout.rstrip("\n"), limit)] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append("[stderr]\n" + clip(result.stderr.rstrip("\n"), limit))
    if result.timed_out:
        parts.append(f"[timed out after {timeout:g} s: the program was killed]")
    elif result.exit_code != 0:
        parts.append(f"[exit code {result.exit_code}]")
    if result.truncated:
        parts.append("[output over the sandbox's limit was dropped]")
    return "\n".join(parts) or "[no output: print() the values you want to see]"


class MathToolEnv(MathEnv, ToolEnv):
    """Math with a ``python`` tool: turns with tool calls get the programs' output (reward 0,
    the episode goes on); the first turn without one is graded with math-verify against the
    task's ``answer`` (reward 1.0 or 0.0) and ends the episode.

    Tasks as in :class:`~vime.envs.math_env.MathEnv` (``tasks`` file or rows, else seeded
    arithmetic, ``difficulty`` "hard" by default). Each call runs ``code`` as a fresh
    ``python3`` process in the episode's sandbox (backend ``sandbox``, options
    ``sandbox_options``), killed after ``code_timeout`` seconds; files persist for the episode.
    Output beyond ``max_output_chars`` per stream is cut. Bound the turns with the agent loop's
    ``--max-turns`` or ``vime.make(..., max_turns=N)``.
    """

    def __init__(
        self,
        *,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        difficulty: str = "hard",
        system_prompt: str | None = SYSTEM_PROMPT,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
        code_timeout: float = 10.0,
        max_output_chars: int = 2000,
        **kwargs: Any,
    ):
        super().__init__(tasks=tasks, difficulty=difficulty, system_prompt=system_prompt, **kwargs)
        if code_timeout <= 0 or max_output_chars < 100:
            raise ValueError(
                f"need code_timeout > 0 and max_output_chars >= 100, got {code_timeout!r} and "
                f"{max_output_chars!r}"
            )
        self.sandbox = EpisodeSandbox(sandbox, sandbox_options)
        self.code_timeout = code_timeout
        self.max_output_chars = max_output_chars
        if kwargs.get("tool_timeout") is None:
            self.tool_timeout = code_timeout + TOOL_TIMEOUT_MARGIN

    @tool
    async def python(self, code: str) -> str:
        """Run a Python 3 program and return what it prints (stdout, then stderr and the exit
        code if it failed). Only the standard library is available and there is no network;
        each call is a fresh process, so print() every value you want to see.

        Args:
            code: The complete program to run.
        """
        box = await self.sandbox.get()
        result = await box.run_code(code, timeout=self.code_timeout)
        return format_result(result, timeout=self.code_timeout, limit=self.max_output_chars)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync :meth:`areset`."""
        return self._run_sync(self.areset(seed=seed, options=options))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pose one question (closing a sandbox a truncated episode left open)."""
        await self.sandbox.close()
        return MathEnv.reset(self, seed=seed, options=options)

    def step(self, action: Message | str) -> StepResult:
        """Sync :meth:`astep`."""
        return self._run_sync(self.astep(action))

    async def astep(self, action: Message | str) -> StepResult:
        """Run the turn's tool calls, or grade the answer and end the episode."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        result = await super().astep(action)
        if result[2]:
            await self.sandbox.close()
        return result

    def answer(self, message: Message) -> StepResult:
        """Grade a turn without tool calls with math-verify; the episode ends."""
        return MathEnv.step(self, message)

    def close(self) -> None:
        """Close the episode's sandbox and the env."""
        if self.sandbox.box is not None:
            self._run_sync(self.sandbox.close())
        super().close()
