"""A counting tool env for agent and rollout tests (Hermes tool calls parsed locally)."""

from __future__ import annotations

import asyncio
import json
import re

import vime

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class CountingEnv(vime.ToolEnv):
    """Add numbers with a tool; the episode ends when the model answers without a tool call.

    Reward 1.0 when the answer names the number of tool calls made. Parses Hermes tool calls
    itself so these tests depend only on the env core.
    """

    def __init__(self, hang_tool: bool = False, stuck_reset: bool = False) -> None:
        super().__init__(tool_timeout=0.5)
        self.hang_tool = hang_tool
        self.stuck_reset = stuck_reset
        self.calls = 0

    @vime.tool
    async def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        if self.hang_tool:
            await asyncio.sleep(3600)
        self.calls += 1
        return str(a + b)

    async def areset(self, *, seed=None, options=None):
        await super().areset(seed=seed)
        if self.stuck_reset:
            await asyncio.sleep(3600)
        self.calls = 0
        task = (options or {}).get("task") or {}
        question = task.get("question", "Count with the add tool, then say the count.")
        return [
            {"role": "system", "content": "You count."},
            {"role": "user", "content": question},
        ], {}

    def parse_action(self, action):
        if isinstance(action, dict):
            if "tool_calls" in action:
                return action
            action = action.get("content") or ""
        calls = []
        for i, body in enumerate(_CALL.findall(action)):
            call = json.loads(body)
            calls.append(
                {
                    "id": f"call_{self.calls}_{i}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                }
            )
        message = {"role": "assistant", "content": _CALL.sub("", action).strip()}
        if calls:
            message["tool_calls"] = calls
        return message

    def answer(self, message):
        correct = str(self.calls) in (message.get("content") or "")
        return [], 1.0 if correct else 0.0, True, False, {}
