"""vime/MathTool-v0: math with a python tool that runs in a real bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest

import vime
from vime.envs.checker import check
from vime.envs.math_tool import clip

TASK = {
    "id": "big",
    "question": "What is 2 to the power 100?",
    "answer": "1267650600228229401496703205376",
}


@pytest.fixture
def env():
    env = vime.make("vime/MathTool-v0")
    env.reset(options={"task": TASK})
    yield env
    env.close()


def run_python(env, tool_call, code):
    return env.step(tool_call("python", code=code))


def test_the_python_tools_output_reaches_the_model(env, tool_call):
    observation, reward, terminated, truncated, info = run_python(env, tool_call, "print(2**100)")
    assert observation == [
        {
            "role": "tool",
            "tool_call_id": "call_0",
            "name": "python",
            "content": "1267650600228229401496703205376",
        }
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_errors": 0}


def test_stderr_and_exit_code_reach_the_model(env, tool_call):
    code = "print('before')\nraise ValueError('bad value')"
    content = run_python(env, tool_call, code)[0][0]["content"]
    assert content.startswith("before\n[stderr]\nTraceback")
    assert "ValueError: bad value" in content and content.endswith("[exit code 1]")


def test_a_program_that_prints_nothing_says_so(env, tool_call):
    assert run_python(env, tool_call, "x = 1")[0][0]["content"] == (
        "[no output: print() the values you want to see]"
    )


def test_an_infinite_loop_ends_at_the_timeout_and_the_episode_goes_on(tool_call):
    env = vime.make("vime/MathTool-v0", code_timeout=1.0)
    try:
        env.reset(options={"task": TASK})
        start = time.monotonic()
        observation, reward, terminated, _, info = run_python(env, tool_call, "while True: pass")
        assert time.monotonic() - start < 10
        assert observation[0]["content"] == "[timed out after 1 s: the program was killed]"
        assert (reward, terminated, info["tool_errors"]) == (0.0, False, 0)
        assert run_python(env, tool_call, "print(2**100)")[0][0]["content"] == TASK["answer"]
        _, reward, terminated, _, info = env.step(f"So it is \\boxed{{{TASK['answer']}}}.")
        assert (reward, terminated, info["correct"]) == (1.0, True, 1.0)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [({"code": ["print(1)"]}, "argument 'code'"), ({}, "code"), ({"source": "print(1)"}, "code")],
)
def test_a_tool_call_with_bad_arguments_becomes_an_error_message(env, arguments, problem):
    call = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": arguments}}
    action = {"role": "assistant", "content": None, "tool_calls": [call]}
    observation, reward, terminated, _, info = env.step(action)
    assert observation[0]["role"] == "tool" and observation[0]["tool_call_id"] == "c1"
    content = observation[0]["content"]
    assert content.startswith("Error: invalid arguments for tool 'python'") and problem in content
    assert (reward, terminated) == (0.0, False)
    assert info["tool_errors"] == 1 and info["tool_errors/invalid_arguments"] == 1


def test_answers_are_graded_with_math_verify_and_end_the_episode(env, tool_call):
    run_python(env, tool_call, "print(2**100)")
    workdir = env.unwrapped.sandbox.box.workdir
    assert workdir.is_dir()
    _, reward, terminated, _, info = env.step(f"The answer is \\boxed{{{TASK['answer']}}}")
    assert (reward, terminated, info["correct"]) == (1.0, True, 1.0)
    assert env.unwrapped.sandbox.box is None and not workdir.exists()  # sandbox closed
    env.reset(options={"task": TASK})
    _, reward, terminated, _, info = env.step("The answer is \\boxed{2^{100}}")
    assert (reward, info["answer_rejected"]) == (0.0, "not_a_value")  # the work is left undone
    env.reset(options={"task": TASK})
    _, reward, terminated, _, info = env.step("\\boxed{1267650600228229401496703205377}")
    assert (reward, terminated, info["correct"]) == (0.0, True, 0.0)


def test_files_last_for_the_episode_only(env, tool_call):
    run_python(env, tool_call, "open('notes.txt', 'w').write('kept')")
    assert run_python(env, tool_call, "print(open('notes.txt').read())")[0][0]["content"] == "kept"
    env.reset(options={"task": TASK})
    content = run_python(env, tool_call, "print(open('notes.txt').read())")[0][0]["content"]
    assert "FileNotFoundError" in content


def test_the_tool_has_no_network(env, tool_call):
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"
    content = run_python(env, tool_call, code)[0][0]["content"]
    assert "OSError: [Errno 101] Network is unreachable" in content


def test_max_turns_truncates_an_episode_of_tool_calls(tool_call):
    env = vime.make("vime/MathTool-v0", max_turns=2)
    try:
        env.reset(options={"task": TASK})
        assert run_python(env, tool_call, "print(1)")[2:4] == (False, False)
        *_, terminated, truncated, info = run_python(env, tool_call, "print(2)")
        assert (terminated, truncated, info["max_turns_reached"]) == (False, True, True)
    finally:
        env.close()


def test_async_episodes_run_concurrently_with_their_own_sandboxes(tool_call):
    envs = [vime.make("vime/MathTool-v0") for _ in range(4)]

    async def play(env, i):
        await env.areset(options={"task": TASK})
        observation, *_ = await env.astep(tool_call("python", code=f"print({i} * 7)"))
        final = await env.astep("\\boxed{0}")
        return observation[0]["content"], final[2]

    async def all_at_once():
        return await asyncio.gather(*(play(env, i) for i, env in enumerate(envs)))

    try:
        assert asyncio.run(all_at_once()) == [(str(i * 7), True) for i in range(4)]
    finally:
        for env in envs:
            env.close()


def test_generated_tasks_are_hard_arithmetic_by_default():
    env = vime.make("vime/MathTool-v0")
    tasks = env.unwrapped.generate_tasks(5, seed=0)
    assert len(tasks) == 5 and all(t["id"].startswith("arith-hard-") for t in tasks)
    assert tasks == env.unwrapped.generate_tasks(5, seed=0)


def test_long_output_is_clipped_keeping_both_ends():
    text = "a" * 150 + "b" * 150
    assert clip(text, 100) == "a" * 50 + "\n... [200 characters cut] ...\n" + "b" * 50
    assert clip("short", 100) == "short"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="code_timeout > 0"):
        vime.make("vime/MathTool-v0", code_timeout=0)
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        vime.make("vime/MathTool-v0", sandbox="nope")


@pytest.mark.slow
def test_vime_env_check_passes():
    report = check("vime/MathTool-v0")
    assert report.ok, report.format()
    assert "1 tool(s): python" in report.results[0].detail
