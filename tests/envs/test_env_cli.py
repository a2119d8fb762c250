"""``vime env list | check | play`` through the installed console script."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import vime
from vime.cli.main import main

VIME = str(Path(sys.executable).parent / "vime")

BROKEN_ENV = '''
import vime
from vime.cli.main import main


class Leaky(vime.Env):
    """Keeps its turns on the class, so concurrent episodes see each other."""

    turns = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}

    def step(self, action):
        self.turns.append(1)
        return [{"role": "user", "content": str(len(self.turns))}], 0.0, False, False, {}


vime.register("test/Leaky-v0", Leaky)
'''

TOOL_ENV = '''
import vime
from vime.cli.main import main


class Adder(vime.ToolEnv):
    """Add 2 and 3 with the add tool."""

    @vime.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        return a + b

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "What is 2 + 3?"}], {}

    def answer(self, message):
        correct = "5" in (message["content"] or "")
        return [], float(correct), True, False, {}


vime.register("test/Adder-v0", Adder)
'''


def vime_cmd(*args: str, stdin: str = "", cwd: Path | None = None, env: dict | None = None):
    """The real console script in a subprocess (about 3-5 s each: keep these few)."""
    return subprocess.run(
        [VIME, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def test_env_list_shows_the_builtin_envs_and_not_gymnasiums():
    result = vime_cmd("env", "list")
    assert result.returncode == 0, result.stderr
    ids = [line.split()[0] for line in result.stdout.splitlines()]
    assert {"vime/Math-v0", "vime/GuessNumber-v0", "vime/ReasoningGym-v0"} <= set(ids)
    assert "CartPole-v1" not in ids
    assert re.search(r"^vime/Math-v0 +vime\.envs\.math_env:MathEnv$", result.stdout, re.M)


def test_env_list_shows_envs_of_installed_plugins(tmp_path):
    (tmp_path / "leaky_plugin.py").write_text(BROKEN_ENV)
    info = tmp_path / "leaky_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: leaky-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vime.envs]\nleaky = leaky_plugin\n")
    result = vime_cmd("env", "list", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "test/Leaky-v0" in result.stdout


def test_env_check_passes_the_game():
    result = vime_cmd("env", "check", "vime/GuessNumber-v0", "--episodes", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Checking vime/GuessNumber-v0"
    assert sum(line.lstrip().startswith("PASS") for line in lines) == 9
    assert lines[-1] == "9 passed, 0 failed"


def test_env_check_passes_math_in_process(capsys):
    assert main(["env", "check", "vime/Math-v0", "--seed", "3", "--episodes", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "9 passed, 0 failed"


def test_env_check_of_a_buggy_env_exits_1_and_names_the_failed_check(tmp_path, monkeypatch, capsys):
    (tmp_path / "leaky_env.py").write_text(BROKEN_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["env", "check", "leaky_env:test/Leaky-v0"]) == 1
    failed = [
        line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("FAIL")
    ]
    assert any("concurrent episodes" in line for line in failed)
    sys.modules.pop("leaky_env", None)


def test_env_check_of_an_unknown_id_exits_2_with_suggestions():
    result = vime_cmd("env", "check", "vime/Maht-v0")
    assert result.returncode == 2
    assert "unknown env id 'vime/Maht-v0'. Closest registered ids: vime/Math-v0" in result.stderr


def test_env_check_rejects_a_malformed_kwarg(capsys):
    assert main(["env", "check", "vime/Math-v0", "--kwarg", "difficulty"]) == 2
    assert "--kwarg expects KEY=VALUE, got 'difficulty'" in capsys.readouterr().err


def test_kwargs_reach_the_env_as_json_values(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["env", "play", "vime/GuessNumber-v0", "-k", "high=5", "-k", "max_guesses=2"]) == 0
    assert "between 1 and 5. Guess it in at most 2 turns" in capsys.readouterr().out


def test_env_play_with_piped_input_shows_messages_rewards_and_the_end():
    env = vime.make("vime/GuessNumber-v0")
    env.reset(seed=5)
    secret = env.unwrapped.secret
    wrong = 1 if secret != 1 else 2
    result = vime_cmd(
        "env",
        "play",
        "vime/GuessNumber-v0",
        "--seed",
        "5",
        stdin=f"/help\nhello\n{wrong}\n{secret}\n",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "=== episode 1 (seed 5) ===" in out
    assert "[user] I am thinking of an integer between 1 and 100." in out
    assert "Commands: /tools (list tools), /reset (new episode), /help, /quit." in out
    assert (
        "assistant> hello\n[user] I found no number in your reply. 6 guesses left.\n  reward +0 (return 0)"
        in out
    )
    assert f"[user] Correct! The number was {secret}, found in 3 guesses." in out
    assert out.rstrip().endswith(
        "=== episode over (terminated: the task ended) after 3 turn(s), return 1.1 ==="
    )


def test_env_play_of_a_tool_env_runs_typed_tool_calls(tmp_path):
    (tmp_path / "adder_env.py").write_text(TOOL_ENV)
    typed = textwrap.dedent(
        """\
        <tool_call>{"name": "add", "arguments": {"a": 2, "b": "three"}}</tool_call>
        <tool_call>{"name": "add", \\
        "arguments": {"a": 2, "b": 3}}</tool_call>
        It is 5.
        """
    )
    result = vime_cmd("env", "play", "adder_env:test/Adder-v0", stdin=typed, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tools: add(a: integer, b: integer): Add two integers." in out
    assert "[tool add] Error: invalid arguments for tool 'add'" in out
    assert "tool_calls=1, tool_errors=1, tool_errors/invalid_arguments=1" in out
    assert "[tool add] 5\n" in out
    assert "=== episode over (terminated: the task ended) after 3 turn(s), return 1 ===" in out


def test_env_play_stops_cleanly_at_end_of_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["env", "play", "vime/Math-v0"]) == 0
    assert "=== stopped after 0 turn(s), return 0 ===" in capsys.readouterr().out


def test_env_play_with_max_turns_truncates(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["env", "play", "vime/GuessNumber-v0", "--max-turns", "1"]) == 0
    out = capsys.readouterr().out
    assert "max_turns_reached=True" in out
    assert "=== episode over (truncated: a limit cut it short) after 1 turn(s), return 0 ===" in out


def test_env_play_quit_and_reset_commands(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("/tools\n/reset\n\n/quit\n"))
    assert main(["env", "play", "vime/GuessNumber-v0", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "=== episode over (reset by you) after 0 turn(s), return 0 ===" in out
    assert "=== episode 2 (seed 2) ===" in out
    assert "(nothing sent: type a reply, or /help)" in out
    assert out.rstrip().endswith("=== stopped after 0 turn(s), return 0 ===")
