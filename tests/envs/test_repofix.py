"""vime/RepoFix-v0 on a small inline repository, in local (bubblewrap) sandboxes."""

from __future__ import annotations

import asyncio
import json

import pytest

import vime
from vime.envs.repofix.env import RepoFixEnv
from vime.envs.repofix.tasks import TaskFileError, validate_repofix_task

SOURCE = '''"""Tiny statistics."""


def mean(values):
    return sum(values) / len(values)


def clamp(x, low, high):
    if x < low:
        return low
    if x > high:
        return high
    return x
'''
TESTS = """import unittest

from stats import clamp, mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5
"""
TASK = {
    "id": "stats-1",
    "repo": {"stats.py": SOURCE, "tests/test_stats.py": TESTS},
    "patch": [{"path": "stats.py", "old": "    if x > high:", "new": "    if x < high:"}],
    "fix": [{"path": "stats.py", "old": "    if x < high:", "new": "    if x > high:"}],
    "instruction": "clamp() returns the upper bound for values inside the range.",
    "visible_tests": ["tests/test_stats.py::test_clamp_inside"],
    "hidden_tests": ["tests/test_stats.py"],
}


def call(name: str, **arguments) -> str:
    """A Hermes-style tool call, as a model writes it (the env parses it)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def tool_text(env: RepoFixEnv, name: str, **arguments) -> str:
    """Take a turn that calls one tool; the tool message's text."""
    observation, reward, terminated, truncated, _ = await env.astep(call(name, **arguments))
    assert (reward, terminated, truncated) == (0.0, False, False)
    return observation[0]["content"]


@pytest.fixture
async def env():
    env = RepoFixEnv(tasks=[TASK], sandbox="local")
    await env.areset(options={"task": TASK})
    yield env
    await env.sandbox.close()


async def test_the_repository_starts_with_the_bug_and_the_instruction(env):
    messages, info = await env.areset(options={"task": TASK})
    assert info == {"task_id": "stats-1"}
    assert messages[-1]["content"].startswith("clamp() returns the upper bound")
    assert "tests/test_stats.py::test_clamp_inside" in messages[-1]["content"]
    text = await tool_text(env, "read_file", path="stats.py", start_line=11, end_line=12)
    assert text == "11      if x < high:\n12          return high"


async def test_str_replace_refuses_text_that_is_missing_or_not_unique(env):
    missing = await tool_text(env, "str_replace", path="stats.py", old_str="if y > 1:", new_str="")
    assert "old_str was not found in stats.py" in missing
    twice = await tool_text(
        env, "str_replace", path="stats.py", old_str="        return", new_str=""
    )
    assert "old_str occurs 2 times in stats.py (lines 10, 12)" in twice
    assert env.tool_errors == 2


async def test_read_file_refuses_a_range_past_the_end(env):
    text = await tool_text(env, "read_file", path="stats.py", start_line=99)
    assert "start_line=99 is past the end: stats.py has 13 lines" in text


async def test_the_reference_fix_through_the_tools_scores_one_with_its_diff(env):
    before = await tool_text(env, "run_tests")
    assert before.startswith("0 passed, 1 failed.")
    fix = TASK["fix"][0]
    await tool_text(env, "str_replace", path=fix["path"], old_str=fix["old"], new_str=fix["new"])
    assert (await tool_text(env, "run_tests")).startswith("1 passed, 0 failed.")
    _, reward, terminated, truncated, info = await env.astep(call("submit"))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["pass_fraction"] == 1.0 and info["tests_run"] == 4 and info["turns"] == 4
    assert info["diff"] == (
        "--- a/stats.py\n+++ b/stats.py\n@@ -8,6 +8,6 @@\n"
        " def clamp(x, low, high):\n     if x < low:\n         return low\n"
        "-    if x < high:\n+    if x > high:\n         return high\n     return x\n"
    )
    assert env.sandbox.box is None  # closed once graded


async def test_submitting_the_bug_scores_zero_with_the_pass_fraction(env):
    _, reward, terminated, _, info = await env.astep(call("submit"))
    assert (reward, terminated) == (0.0, True)
    assert info["pass_fraction"] == 0.5 and info["tests_passed"] == 2
    assert info["diff"] == "" and info["submitted"] is True


async def test_editing_the_tests_does_not_change_the_grade(env):
    await tool_text(
        env, "write_file", path="tests/test_stats.py", content="def test_ok():\n    pass\n"
    )
    assert (await tool_text(env, "run_tests")).startswith("0 passed, 1 failed")
    _, reward, _, _, info = await env.astep(call("submit"))
    assert reward == 0.0 and info["tests_run"] == 4
    assert "+++ b/tests/test_stats.py" in info["diff"]


async def test_running_out_of_turns_grades_and_truncates():
    env = RepoFixEnv(tasks=[TASK], sandbox="local", max_turns=2)
    await env.areset(options={"task": TASK})
    fix = TASK["fix"][0]
    first = await env.astep(
        call("str_replace", path=fix["path"], old_str=fix["old"], new_str=fix["new"])
    )
    assert first[1:4] == (0.0, False, False)
    observation, reward, terminated, truncated, info = await env.astep(
        {"role": "assistant", "content": "done?"}
    )
    assert "call `submit`" in observation[0]["content"]
    assert (reward, terminated, truncated) == (1.0, False, True)
    assert info["submitted"] is False and info["turns"] == 2


async def test_a_bash_command_runs_in_the_repository_root(env):
    text = await tool_text(
        env, "bash", command="ls tests && python3 -c 'import stats; print(stats.clamp(5, 0, 10))'"
    )
    assert text == "test_stats.py\n10"


@pytest.mark.parametrize(
    "backend", ["local", pytest.param("docker", marks=[pytest.mark.slow, pytest.mark.docker])]
)
async def test_sixty_four_concurrent_episodes_share_nothing(backend):
    envs = [RepoFixEnv(tasks=[TASK], sandbox=backend) for _ in range(64)]
    try:
        await asyncio.gather(*(e.areset(options={"task": TASK}) for e in envs))
        await asyncio.gather(
            *(
                tool_text(e, "bash", command=f"echo {i} > marker-{i} && echo x >> stats.py")
                for i, e in enumerate(envs)
            )
        )
        seen = await asyncio.gather(
            *(tool_text(e, "bash", command="ls marker-* && wc -l < stats.py") for e in envs)
        )
        assert seen == [f"marker-{i}\n14" for i in range(64)]
    finally:  # a failure here must not leave 64 sandboxes to the next tests
        await asyncio.gather(*(e.sandbox.close() for e in envs))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"repo": 3}, "'repo' must be a snapshot name or path"),
        ({"hidden_tests": []}, "'hidden_tests' is empty"),
        ({"visible_tests": "tests/test_stats.py"}, "'visible_tests' must be a list"),
        ({"patch": [{"path": "stats.py"}]}, "'patch' must be a list of"),
    ],
)
def test_bad_task_rows_are_refused_with_the_reason(change, message):
    with pytest.raises(TaskFileError, match=message):
        validate_repofix_task({**TASK, **change})


async def test_a_patch_whose_text_is_not_in_the_repository_is_refused():
    env = RepoFixEnv(tasks=[TASK], sandbox="local")
    bad = {**TASK, "patch": [{"path": "stats.py", "old": "nowhere", "new": ""}]}
    with pytest.raises(
        TaskFileError, match="expects its 'old' text exactly once, found it 0 times"
    ):
        await env.areset(options={"task": bad})


def test_registered_and_made_through_vime_make():
    env = vime.make("vime/RepoFix-v0", tasks=[TASK], sandbox="local")
    assert sorted(env.unwrapped.tools) == [
        "bash",
        "read_file",
        "run_tests",
        "str_replace",
        "submit",
        "write_file",
    ]
    env.close()


async def test_an_episode_cut_by_the_agent_loop_is_graded_once_by_afinish(env):
    fix = TASK["fix"][0]
    await tool_text(env, "str_replace", path=fix["path"], old_str=fix["old"], new_str=fix["new"])
    reward, info = await env.afinish()
    assert reward == 1.0 and info["submitted"] is False and info["turns"] == 1
    assert await env.afinish() == (0.0, {})  # already graded
