"""``vime/RepoFix-v0``: fix a bug in a real repository inside a sandbox, with shell, file and
test tools; graded by hidden tests when the model submits or runs out of turns."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from vime.data import draw_tasks
from vime.envs.base import StepResult, ToolEnv
from vime.envs.episode_sandbox import EpisodeSandbox
from vime.envs.math_tool import clip, format_result
from vime.envs.repofix.tasks import (
    apply_edits,
    load_task_set,
    repo_files,
    test_paths,
    validate_repofix_task,
)
from vime.envs.repofix.testing import TestRun, run_tests
from vime.envs.tools import tool
from vime.errors import EnvError
from vime.types import Message

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository in your working directory. "
    "Use the tools to explore the code, reproduce the failure, edit files and run the tests. "
    "When the fix is done, call `submit`; hidden tests then decide whether it is right."
)
NUDGE = "Use the tools to inspect and fix the repository, then call `submit` when you are done."
# Reads {path: sha256} of the episode's first files on stdin; prints the files that differ
# from them as JSON ({path: text, or None when not text}; deleted ones under "deleted").
CHANGED_FILES = r"""
import hashlib, json, os, sys
start = json.load(sys.stdin)
out, seen = {}, set()
for root, dirs, names in os.walk("."):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(names):
        path = os.path.join(root, name)[2:]
        if name.endswith(".pyc"):
            continue
        seen.add(path)
        with open(path, "rb") as f:
            data = f.read()
        if start.get(path) == hashlib.sha256(data).hexdigest():
            continue
        try:
            out[path] = data.decode("utf-8") if len(data) < 1 << 18 else None
        except UnicodeDecodeError:
            out[path] = None
print(json.dumps({"changed": out, "deleted": sorted(set(start) - seen)}))
"""
TOOL_TIMEOUT_MARGIN = 30.0  # beyond a command's own limit: starting the sandbox, killing


def repo_diff(before: dict[str, str], changed: dict[str, str | None], deleted: list[str]) -> str:
    """A unified diff from the files ``before`` to those ``changed`` (None: not text, or
    too large to show) and ``deleted``."""
    after: dict[str, str | None] = {
        **{p: t for p, t in before.items() if p not in deleted},
        **changed,
    }
    chunks = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if new is None and path in after:
            chunks.append(f"Binary or large file {path} changed\n")
            continue
        chunks.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{path}" if old is not None else "/dev/null",
                tofile=f"b/{path}" if path in after else "/dev/null",
            )
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in chunks)


class RepoFixEnv(ToolEnv):
    """Fix the bug a task describes in a repository copied fresh into the episode's sandbox.

    Tools: ``bash`` (a shell command in the repository root), ``read_file`` (with a line
    range), ``write_file``, ``str_replace`` (one exact, unique replacement), ``run_tests`` (the
    task's visible tests) and ``submit``. A turn without tool calls is answered with a
    reminder to use them.

    The episode ends when the model calls ``submit`` (terminated) or after ``max_turns`` turns
    (truncated); either way the task's hidden tests run on pristine copies of the test files
    and the reward is 1.0 when all of them pass, else 0.0. The last step's ``info`` has
    ``pass_fraction``, ``tests_passed``, ``tests_run``, ``turns``, ``episode_tool_errors``,
    ``submitted`` and ``diff`` (the model's changes as a unified diff).

    Tasks (see :mod:`vime.envs.repofix.tasks`): ``options["task"]``, else a row drawn from
    ``tasks`` (a task set folder, a JSONL file or rows), else from the set shipped with Vime;
    ``split`` picks ``train`` or the held-out ``eval`` rows of a folder. ``sandbox`` is
    ``docker`` by default (``local``: bubblewrap), with ``sandbox_options``.
    """

    def __init__(
        self,
        *,
        tasks: str | Path | list[dict[str, Any]] | None = None,
        split: str = "train",
        sandbox: str = "docker",
        sandbox_options: dict[str, Any] | None = None,
        max_turns: int = 30,
        command_timeout: float = 60.0,
        test_timeout: float = 300.0,
        max_output_chars: int = 8000,
        system_prompt: str | None = SYSTEM_PROMPT,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if max_turns < 1 or command_timeout <= 0 or test_timeout <= 0 or max_output_chars < 200:
            raise ValueError(
                f"need max_turns >= 1, command_timeout > 0, test_timeout > 0 and "
                f"max_output_chars >= 200; got {max_turns!r}, {command_timeout!r}, "
                f"{test_timeout!r}, {max_output_chars!r}"
            )
        if isinstance(tasks, list):
            self.tasks = [
                validate_repofix_task(t, where=f"tasks[{i}]") for i, t in enumerate(tasks)
            ]
        else:
            self.tasks = load_task_set(tasks, split)
        self.sandbox = EpisodeSandbox(sandbox, sandbox_options)
        self.max_turns = max_turns
        self.command_timeout = command_timeout
        self.test_timeout = test_timeout
        self.max_output_chars = max_output_chars
        self.system_prompt = system_prompt
        if kwargs.get("tool_timeout") is None:
            self.tool_timeout = max(command_timeout, test_timeout) + TOOL_TIMEOUT_MARGIN
        self.task: dict[str, Any] | None = None
        self.start_files: dict[str, str] = {}
        self.pristine: dict[str, str] = {}
        self._reset_counts()

    def _reset_counts(self) -> None:
        self.turns = 0
        self.tool_errors = 0
        self.submitted = False

    # --- tasks ---
    def task_pool(self) -> list[dict[str, Any]]:
        """The rows this env draws from."""
        return list(self.tasks)

    def generate_tasks(self, count: int, *, seed: int) -> list[dict[str, Any]]:
        """``count`` rows of the pool drawn without replacement with ``seed`` (all of them
        when ``count`` covers it)."""
        return draw_tasks(self.tasks, count, seed=seed)

    # --- tools ---
    @tool
    async def bash(self, command: str) -> str:
        """Run a shell command in the repository root and return its output (stdout, then
        stderr and the exit code if it failed). There is no network; each call is a fresh
        shell, so `cd` does not carry over.

        Args:
            command: The command line, run by `sh -c`.
        """
        box = await self.sandbox.get()
        result = await box.run(command, timeout=self.command_timeout)
        return format_result(result, timeout=self.command_timeout, limit=self.max_output_chars)

    @tool
    async def read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        """Show a file of the repository with line numbers.

        Args:
            path: The file's path from the repository root.
            start_line: The first line to show (1-based).
            end_line: The last line to show (default: the end of the file).
        """
        lines = (await self._read(path)).splitlines()
        if start_line < 1 or (end_line is not None and end_line < start_line):
            raise ValueError(
                f"need 1 <= start_line <= end_line, got start_line={start_line}, "
                f"end_line={end_line} ({path} has {len(lines)} lines)"
            )
        if start_line > max(len(lines), 1):
            raise ValueError(
                f"start_line={start_line} is past the end: {path} has {len(lines)} lines"
            )
        last = len(lines) if end_line is None else min(end_line, len(lines))
        width = len(str(last))
        shown = "\n".join(f"{n:>{width}}  {lines[n - 1]}" for n in range(start_line, last + 1))
        return clip(shown, self.max_output_chars) if shown else f"({path} is empty)"

    @tool
    async def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a file of the repository with `content`.

        Args:
            path: The file's path from the repository root.
            content: The whole new content of the file.
        """
        box = await self.sandbox.get()
        await box.write_file(path, content)
        return f"Wrote {len(content.splitlines())} lines to {path}."

    @tool
    async def str_replace(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the one occurrence of `old_str` in a file with `new_str`. `old_str` must
        match the file exactly (whitespace included) and occur exactly once: add lines
        around it to make it unique.

        Args:
            path: The file's path from the repository root.
            old_str: The exact text to replace.
            new_str: The text to put in its place.
        """
        text = await self._read(path)
        if not old_str:
            raise ValueError("old_str is empty; give the exact text to replace")
        count = text.count(old_str)
        if count == 0:
            raise ValueError(
                f"old_str was not found in {path}; it must match the file exactly, "
                f"whitespace and indentation included (read_file shows the current text)"
            )
        if count > 1:
            lines = [text[:i].count("\n") + 1 for i in _find_all(text, old_str)]
            raise ValueError(
                f"old_str occurs {count} times in {path} (lines {', '.join(map(str, lines))}); "
                f"include more surrounding lines so that it occurs exactly once"
            )
        box = await self.sandbox.get()
        await box.write_file(path, text.replace(old_str, new_str))
        line = text[: text.index(old_str)].count("\n") + 1
        return f"Replaced 1 occurrence in {path} at line {line}."

    @tool
    async def run_tests(self) -> str:
        """Run the task's visible tests and report what passed and what failed."""
        assert self.task is not None
        selectors = self.task.get("visible_tests") or self.task["hidden_tests"]
        run = await self._run(selectors, restore=False)
        return clip(run.summary(), self.max_output_chars)

    @tool
    async def submit(self) -> str:
        """Submit the repository as it is now: hidden tests decide the reward and the episode
        ends."""
        self.submitted = True
        return "Submitted."

    async def _read(self, path: str) -> str:
        box = await self.sandbox.get()
        data = await box.read_file(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path} is not a UTF-8 text file") from exc

    async def _run(self, selectors: list[str], *, restore: bool) -> TestRun:
        box = await self.sandbox.get()
        files = None
        if restore:  # the grade never depends on what the model did to the tests
            files = {p: self.pristine[p] for p in test_paths(selectors) if p in self.pristine}
        return await run_tests(box, selectors, timeout=self.test_timeout, files=files)

    # --- the episode ---
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Copy a fresh repository with the task's bug into a new sandbox and pose the task."""
        await super().areset(seed=seed)
        await self.sandbox.close()  # a truncated episode may have left one open
        if options and options.get("task") is not None:
            task = validate_repofix_task(options["task"])
        else:
            if not self.tasks:
                raise EnvError("RepoFix-v0 has no tasks: give tasks=FOLDER or FILE.jsonl")
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        self.pristine = repo_files(task)
        self.start_files = apply_edits(self.pristine, task.get("patch") or [])
        self.task = task
        self._reset_counts()
        box = await self.sandbox.get()
        await box.run(["true"], files=self.start_files)
        visible = task.get("visible_tests") or []
        tests = "".join(f"\n- {t}" for t in visible)
        prompt = str(task["instruction"])
        if tests:
            prompt += f"\n\nThe `run_tests` tool runs these tests:{tests}"
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {"task_id": task["id"]}

    def step(self, action: Message | str) -> StepResult:
        """Sync :meth:`astep`."""
        return self._run_sync(self.astep(action))

    async def astep(self, action: Message | str) -> StepResult:
        """Run the turn's tools; grade on ``submit`` or when the turns are used up."""
        if self.task is None:
            raise EnvError("call reset() before step()")
        message = self.parse_action(action)
        self.turns += 1
        observation: list[Message] = []
        info: dict[str, Any] = {}
        if message.get("tool_calls"):
            results = await self.arun_tools(message)
            observation, info = list(results), dict(results.metrics)
            self.tool_errors += info["tool_errors"]
        else:
            observation = [{"role": "user", "content": NUDGE}]
        if self.submitted or self.turns >= self.max_turns:
            reward, graded = await self.grade()
            info.update(graded)
            return observation, reward, self.submitted, not self.submitted, info
        return observation, 0.0, False, False, info

    async def afinish(self) -> tuple[float, dict[str, Any]]:
        """Grade an episode the agent loop cut short (context window or its own turn limit):
        the hidden tests run on the repository as it is. Nothing to do once graded."""
        if self.task is None or self.sandbox.box is None:
            return 0.0, {}
        return await self.grade()

    async def grade(self) -> tuple[float, dict[str, Any]]:
        """Run the hidden tests on the repository as it is; the reward and the final info.
        The sandbox is closed afterwards."""
        assert self.task is not None
        try:
            diff = await self._diff()  # before the grade restores the test files
            run = await self._run(self.task["hidden_tests"], restore=True)
        finally:
            await self.sandbox.close()
        reward = 1.0 if run.all_passed else 0.0
        return reward, {
            "correct": reward,
            "pass_fraction": run.fraction,
            "tests_passed": len(run.passed),
            "tests_run": run.total,
            "turns": self.turns,
            "episode_tool_errors": self.tool_errors,
            "submitted": self.submitted,
            "diff": diff,
            "task_id": self.task["id"],
        }

    async def _diff(self) -> str:
        box = await self.sandbox.get()
        hashes = {p: hashlib.sha256(t.encode()).hexdigest() for p, t in self.start_files.items()}
        result = await box.run(
            ["python3", "-B", "-c", CHANGED_FILES],
            timeout=self.command_timeout,
            stdin=json.dumps(hashes),
        )
        if not result.ok or result.truncated:
            return f"(the diff could not be made: {result.stderr.strip()[-300:]})"
        found = json.loads(result.stdout)
        return repo_diff(self.start_files, found["changed"], found["deleted"])

    def close(self) -> None:
        """Close the episode's sandbox and the env."""
        if self.sandbox.box is not None:
            self._run_sync(self.sandbox.close())
        super().close()


def _find_all(text: str, sub: str) -> list[int]:
    found, start = [], text.find(sub)
    while start != -1:
        found.append(start)
        start = text.find(sub, start + 1)
    return found
