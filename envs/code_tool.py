"""``vime/CodeTool-v0``: Code-v0's tasks, where the model may run code and the task's visible
examples in the sandbox over several turns before it answers; graded like Code-v0."""

from __future__ import annotations

import ast
import doctest
import re
from typing import Any

from vime.data import TaskFileError
from vime.envs.base import StepResult, ToolEnv
from vime.envs.code import CodeEnv
from vime.envs.code_grader import TestPlan, extract_code, run_tests, solution_source
from vime.envs.math_tool import TOOL_TIMEOUT_MARGIN, MathToolEnv
from vime.envs.tools import tool
from vime.errors import EnvError
from vime.types import Message

SYSTEM_PROMPT = (
    "You are an expert Python programmer. Before you answer you may call `python` to run "
    "any program and `run_examples` to test your function on the task's examples. When you "
    "are sure, reply without a tool call, with the complete function (imports included) in "
    "one ```python code block; that reply is graded with hidden tests."
)


# an example written as prose in a docstring: "f(1, 2) == 3", "f(1) => 3", "f(x) ➞ 3", ...
_ARROW = re.compile(r"^\s*(?:for\s+)?(\w+\(.*\))\s*(?:==>|==|=>|->|➞|→|should return)\s*(.+?)\s*$")


def _literal(source: str) -> bool:
    try:
        ast.literal_eval(source)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _literal_call(source: str, name: str | None) -> bool:
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError:
        return False
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and (name is None or call.func.id == name)
        and all(_literal(ast.unparse(a)) for a in [*call.args, *(k.value for k in call.keywords)])
    )


def _docstring(prompt: str, name: str | None) -> str:
    """The docstring of function ``name`` in ``prompt`` (the whole prompt if none is found)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return prompt
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_docstring(node) or ""
    return prompt


def visible_examples(task: dict[str, Any]) -> list[str]:
    """The checks the model may run: the task's ``examples`` (assert statements), else the
    examples in its prompt's docstring (doctest ``>>>`` lines, or ``f(1) == 2`` /
    ``f(1) => 2`` prose with literal arguments), each as ``assert (call) == (expected)``."""
    if "examples" in task:
        examples = task["examples"]
        if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
            raise TaskFileError(
                f"task {task['id']!r}: 'examples' must be a list of Python statements such as "
                f'"assert add(1, 2) == 3", got {examples!r:.200}'
            )
        return list(examples)
    name = task.get("entry_point")
    text = _docstring(str(task.get("prompt", "")), name)
    try:
        found = doctest.DocTestParser().get_examples(text)
    except ValueError:  # a docstring doctest cannot parse (inconsistent indentation)
        found = []
    pairs = [(e.source.strip(), e.want.strip()) for e in found]
    if not pairs:
        pairs = [m.groups() for m in map(_ARROW.match, text.splitlines()) if m]
    return [
        f"assert ({call}) == ({want})"
        for call, want in pairs
        if want and "\n" not in want and _literal(want) and _literal_call(call, name)
    ]


class CodeToolEnv(CodeEnv, ToolEnv):
    """Write a Python function with a sandbox at hand.

    Tools: ``python`` (run a program; as in ``vime/MathTool-v0``) and ``run_examples``
    (test a candidate function on the task's visible examples: its ``examples`` rows, else
    the doctest examples of a HumanEval prompt). Turns with tool calls get the results
    (reward 0); the first turn without one is the answer, graded exactly as in
    ``vime/Code-v0`` (same grader, ``reward_mode``, ``max_attempts`` and ``info``). Tasks as in
    Code-v0: ``tasks`` (JSONL/Parquet or rows), else HumanEval. Bound the turns with the agent
    loop's ``--max-turns`` or ``vime.make(..., max_turns=N)``.
    """

    python = MathToolEnv.python

    def __init__(
        self,
        *,
        system_prompt: str | None = SYSTEM_PROMPT,
        code_timeout: float = 10.0,
        max_output_chars: int = 2000,
        **kwargs: Any,
    ):
        super().__init__(system_prompt=system_prompt, **kwargs)
        if code_timeout <= 0 or max_output_chars < 100:
            raise ValueError(
                f"need code_timeout > 0 and max_output_chars >= 100, got {code_timeout!r} and "
                f"{max_output_chars!r}"
            )
        self.code_timeout = code_timeout
        self.max_output_chars = max_output_chars
        if kwargs.get("tool_timeout") is None:
            self.tool_timeout = max(code_timeout, self.timeout) + TOOL_TIMEOUT_MARGIN

    @tool
    async def run_examples(self, code: str) -> str:
        """Test a candidate solution on the task's visible examples and report which pass.

        Args:
            code: The complete function (imports included), as you would answer it.
        """
        if self.task is None:
            raise EnvError("call reset() before using the tools")
        examples = visible_examples(self.task)
        if not examples:
            return "This task shows no runnable examples; test your code with `python`."
        entry_point = self.task.get("entry_point")
        prefix = self.task.get("prefix", "")
        solution = solution_source(
            extract_code(code, entry_point), prefix=prefix, entry_point=entry_point
        )
        plan = TestPlan(steps=[{"code": e, "counted": True} for e in examples])
        box = await self.sandbox.get()
        report = await run_tests(
            box, solution, plan, timeout=self.timeout, context=prefix, entry_point=entry_point
        )
        return report.summary(max_failures=5)

    async def astep(self, action: Message | str) -> StepResult:
        """Run the turn's tool calls, or grade the answer as Code-v0 does."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        message = self.parse_action(action)
        if message.get("tool_calls"):
            results = await self.arun_tools(message)
            return list(results), 0.0, False, False, results.metrics
        return await CodeEnv.astep(self, message)

    def step(self, action: Message | str) -> StepResult:
        """Sync :meth:`astep`."""
        return self._run_sync(self.astep(action))
