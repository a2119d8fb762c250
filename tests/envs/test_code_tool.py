"""vime/CodeTool-v0: Code-v0's tasks with a python tool and the visible examples runnable in a
bubblewrap sandbox before the graded answer."""

from __future__ import annotations

import json

import pytest

import vime
from vime.envs.code import humaneval_tasks
from vime.envs.code_tool import CodeToolEnv, visible_examples

HUMANEVAL = {task["id"]: dict(task) for task in humaneval_tasks()}
ADD_TASK = {
    "id": "add",
    "prompt": "Write add(a, b), the sum of two integers.",
    "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"],
    "examples": ["assert add(1, 2) == 3"],
}


def call(name: str, **arguments) -> str:
    """A Hermes-style tool call, as a model writes it (the env parses it)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def fenced(code: str) -> dict:
    return {"role": "assistant", "content": f"```python\n{code}\n```"}


@pytest.fixture
def env():
    env = CodeToolEnv()
    yield env
    env.close()


def test_doctest_and_prose_examples_of_humaneval_prompts_become_asserts():
    assert visible_examples(HUMANEVAL["HumanEval/0"]) == [
        "assert (has_close_elements([1.0, 2.0, 3.0], 0.5)) == (False)",
        "assert (has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)) == (True)",
    ]
    assert visible_examples(HUMANEVAL["HumanEval/150"]) == [
        "assert (x_or_y(7, 34, 12)) == (34)",
        "assert (x_or_y(15, 8, 5)) == (5)",
    ]
    # is_happy(a) => False names a variable, not a literal: not runnable, left out
    assert visible_examples(HUMANEVAL["HumanEval/80"]) == []


async def test_examples_run_on_a_candidate_before_the_answer_is_graded(env):
    task = HUMANEVAL["HumanEval/0"]
    await env.areset(options={"task": task})
    wrong = "def has_close_elements(numbers, threshold):\n    return True\n"
    observation, reward, terminated, _, info = await env.astep(call("run_examples", code=wrong))
    assert (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
    assert observation[0]["content"].startswith(
        "1/2 tests passed.\nFailed: assert (has_close_elements([1.0, 2.0, 3.0], 0.5)) == (False)"
    )
    observation, *_ = await env.astep(call("python", code="print(sorted([3, 1, 2]))"))
    assert observation[0]["content"] == "[1, 2, 3]"
    _, reward, terminated, _, info = await env.astep(
        fenced(task["prompt"] + task["canonical_solution"])
    )
    assert (reward, terminated, info["tests_total"], info["correct"]) == (1.0, True, 7, 1.0)


async def test_the_answer_is_graded_like_code_v0_on_the_hidden_tests(env):
    await env.areset(options={"task": ADD_TASK})
    text = (await env.astep(call("run_examples", code="def add(a, b):\n    return 3\n")))[0][0][
        "content"
    ]
    assert text == "1/1 tests passed."  # the visible example alone cannot tell
    _, reward, terminated, _, info = await env.astep(fenced("def add(a, b):\n    return 3\n"))
    assert (reward, terminated, info["tests_passed"], info["tests_total"]) == (0.0, True, 1, 3)


async def test_a_task_without_examples_says_so(env):
    await env.areset(options={"task": {k: v for k, v in ADD_TASK.items() if k != "examples"}})
    text = (await env.astep(call("run_examples", code="def add(a, b):\n    return a + b\n")))[0][0][
        "content"
    ]
    assert text == "This task shows no runnable examples; test your code with `python`."


def test_registered_with_both_tools():
    env = vime.make("vime/CodeTool-v0")
    assert sorted(env.unwrapped.tools) == ["python", "run_examples"]
    env.close()
