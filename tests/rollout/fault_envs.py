"""Envs and hooks for rollout-manager tests: a counting tool env whose task can make it stall,
hang a tool or crash, and a group filter loadable by dotted path."""

from __future__ import annotations

import asyncio
import json
import re

import vime

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class FaultyCountingEnv(vime.ToolEnv):
    """Call ``add`` until the scripted model answers; ``task["fault"]`` injects one fault:
    ``stuck_reset`` (reset never returns), ``hang_tool`` (the tool never returns) or
    ``crash_step`` (step raises)."""

    def __init__(self) -> None:
        super().__init__(tool_timeout=0.3)
        self.fault = None
        self.calls = 0

    @vime.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        if self.fault == "hang_tool":
            await asyncio.sleep(3600)
        self.calls += 1
        return str(a + b)

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        task = (options or {}).get("task") or {}
        self.fault = task.get("fault")
        self.calls = 0
        if self.fault == "stuck_reset":
            await asyncio.sleep(3600)
        return [{"role": "user", "content": task.get("question", "Count.")}], {}

    def parse_action(self, action):
        if isinstance(action, dict):
            if "tool_calls" in action:
                return action
            action = action.get("content") or ""
        calls = [json.loads(body) for body in _CALL.findall(action)]
        message = {"role": "assistant", "content": _CALL.sub("", action).strip()}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{self.calls}_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(calls)
            ]
        return message

    def answer(self, message):
        if self.fault == "crash_step":
            raise RuntimeError("the grader crashed")
        return [], float(self.calls), True, False, {}


def odd_task_ids(group) -> bool:
    """Keep groups whose task id is odd (a filter hook loaded by dotted path in tests)."""
    return int(group[0].task_id) % 2 == 1
