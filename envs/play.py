"""``vime env play``: a person plays an env in the terminal, typing the assistant's turns."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

import gymnasium

from vime.types import Message

HELP = """\
Type the assistant's reply and press Enter. End a line with \\ to continue on the next one.
Call a tool with <tool_call>{"name": "NAME", "arguments": {...}}</tool_call>.
Commands: /tools (list tools), /reset (new episode), /help, /quit. Ctrl-D also quits."""

_EXAMPLES = {
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "string": "text",
    "array": [],
    "object": {},
}


def describe_tools(schemas: list[dict[str, Any]]) -> list[str]:
    """One line per tool: its signature and description, then an example call."""
    if not schemas:
        return ["(this env has no tools)"]
    lines = []
    for schema in schemas:
        function = schema["function"]
        properties = function["parameters"].get("properties", {})
        params = ", ".join(f"{name}: {p.get('type', 'any')}" for name, p in properties.items())
        lines.append(
            f"{function['name']}({params}): {function.get('description', '').splitlines()[0]}"
        )
    first = schemas[0]["function"]
    example = {
        n: _EXAMPLES.get(p.get("type"), "...")
        for n, p in first["parameters"].get("properties", {}).items()
    }
    call = json.dumps({"name": first["name"], "arguments": example})
    lines.append(f"example call: <tool_call>{call}</tool_call>")
    return lines


class Terminal:
    """Where play reads the person's input and writes the transcript."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None):
        self.stdin, self.stdout = stdin or sys.stdin, stdout or sys.stdout
        self.interactive = self.stdin.isatty() and self.stdout.isatty()

    def write(self, text: str = "") -> None:
        """Print a line."""
        print(text, file=self.stdout, flush=True)

    def read(self, prompt: str) -> str | None:
        """One logical line (``\\``-continued); None at end of input. Echoes piped input."""
        parts: list[str] = []
        while True:
            if self.interactive:
                try:
                    line: str | None = input(prompt)
                except EOFError:
                    line = None
            else:
                self.stdout.write(prompt)
                line = self.stdin.readline()
                line = line.rstrip("\n") if line else None
                self.write(line if line is not None else "")
            if line is None:
                return "\n".join(parts) if parts else None
            if line.endswith("\\"):
                parts.append(line[:-1])
                prompt = "... "
                continue
            return "\n".join([*parts, line])


def _show(term: Terminal, messages: list[Message]) -> None:
    for message in messages:
        role = message["role"]
        label = f"tool {message.get('name', '')}".strip() if role == "tool" else role
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(part.get("text", part)) for part in content)
        term.write(f"[{label}] {content if content is not None else ''}")


def _metrics(info: dict[str, Any]) -> str:
    shown = [
        f"{k}={v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else f"{k}={v!r}"
        for k, v in info.items()
    ]
    return ", ".join(shown) or "-"


def play(
    env: gymnasium.Env,
    *,
    seed: int | None = None,
    episodes: int = 1,
    terminal: Terminal | None = None,
    title: str = "",
) -> list[float]:
    """Let a person play ``episodes`` episodes; returns each episode's return.

    Input ends early at end of file or ``/quit`` (the unfinished episode's return is included).
    """
    term = terminal or Terminal()
    read: Callable[[str], str | None] = term.read
    returns: list[float] = []
    base = env.unwrapped
    term.write(f"Playing {title or type(base).__name__}. /help for help.")
    episode = 0
    while episode < episodes:
        episode_seed = None if seed is None else seed + episode
        observation, info = env.reset(seed=episode_seed)
        episode += 1
        term.write(f"\n=== episode {episode} (seed {episode_seed}) ===")
        term.write("tools: " + "\n       ".join(describe_tools(base.tool_schemas)))
        _show(term, observation)
        total, turns, ended = 0.0, 0, ""
        while not ended:
            text = read("assistant> ")
            if text is None or text.strip() == "/quit":
                returns.append(total)
                term.write(f"=== stopped after {turns} turn(s), return {total:g} ===")
                return returns
            command = text.strip()
            if command == "/help":
                term.write(HELP)
                continue
            if command == "/tools":
                term.write("\n".join(describe_tools(base.tool_schemas)))
                continue
            if command == "/reset":
                ended, episodes = "reset by you", episodes + 1  # a reset does not use up an episode
                break
            if not command:
                term.write("(nothing sent: type a reply, or /help)")
                continue
            observation, reward, terminated, truncated, info = env.step(text)
            turns, total = turns + 1, total + float(reward)
            _show(term, observation)
            term.write(f"  reward {float(reward):+g} (return {total:g}) | {_metrics(info)}")
            if terminated:
                ended = "terminated: the task ended"
            elif truncated:
                ended = "truncated: a limit cut it short"
        returns.append(total)
        term.write(f"=== episode over ({ended}) after {turns} turn(s), return {total:g} ===")
    return returns
