"""vime.Env: actions, tools, tool errors as observations, metrics, sync/async bridging."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time

import pytest
from gymnasium.utils.env_checker import check_env

import vime
from vime.envs.base import env_threads, set_env_threads
from vime.errors import EnvError


def test_str_action_is_parsed_into_openai_tool_calls(calc_env, tool_call):
    calc_env.reset(seed=0)
    message = calc_env.parse_action("let me add " + tool_call("add", a=2, b=3))
    assert message["role"] == "assistant"
    assert message["content"].strip() == "let me add"
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "add"
    assert __import__("json").loads(call["function"]["arguments"]) == {"a": 2, "b": 3}


def test_dict_action_with_tool_calls_is_trusted_as_parsed(calc_env):
    action = {
        "role": "assistant",
        "content": "<tool_call>not parsed again</tool_call>",
        "tool_calls": [],
    }
    assert calc_env.parse_action(action) == {"role": "assistant", "content": action["content"]}


def test_dict_action_without_tool_calls_key_has_its_content_parsed(calc_env, tool_call):
    message = calc_env.parse_action({"role": "assistant", "content": tool_call("add", a=1, b=1)})
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["add"]


@pytest.mark.parametrize(
    ("action", "fragment"),
    [
        (42, "got int"),
        ({"role": "user", "content": "hi"}, "role 'user'"),
        ({"role": "assistant", "content": 3}, "content must be"),
        ({"role": "assistant", "content": "", "tool_calls": [{"bad": 1}]}, "no function name"),
    ],
)
def test_actions_that_are_not_assistant_messages_raise_env_error(calc_env, action, fragment):
    with pytest.raises(EnvError, match=fragment):
        calc_env.parse_action(action)


def test_tools_come_from_decorated_methods_and_instance_attributes(calc_env_cls):
    @vime.tool
    def shout(text: str) -> str:
        """Upper-case a text.

        Args:
            text: what to shout
        """
        return text.upper()

    env = calc_env_cls()
    env.shout_tool = shout
    assert sorted(env.tools) == ["add", "explode", "nap", "shout"]
    assert sorted(s["function"]["name"] for s in env.tool_schemas) == [
        "add",
        "explode",
        "nap",
        "shout",
    ]
    add = next(s for s in env.tool_schemas if s["function"]["name"] == "add")
    assert add["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert env.action_space.tool_names == ("add", "explode", "nap", "shout")


def test_two_tools_with_one_name_are_an_error(calc_env_cls):
    @vime.tool(name="add")
    def other_add(a: int) -> int:
        """Another add.

        Args:
            a: a number
        """
        return a

    env = calc_env_cls()
    env.extra = other_add
    with pytest.raises(EnvError, match="two tools named 'add'"):
        _ = env.tools


def test_tool_call_runs_and_its_result_is_the_observation(calc_env, tool_call):
    calc_env.reset(seed=0)
    observation, reward, terminated, truncated, info = calc_env.step(tool_call("add", a=20, b=22))
    assert observation == [
        {
            "role": "tool",
            "tool_call_id": observation[0]["tool_call_id"],
            "name": "add",
            "content": "42",
        }
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"tool_calls": 1, "tool_errors": 0}


def test_a_tool_that_raises_inside_step_becomes_a_counted_error_message(calc_env, tool_call):
    calc_env.reset(seed=0)
    observation, reward, terminated, _, info = calc_env.step(tool_call("explode", reason="test"))
    assert observation[0]["role"] == "tool"
    assert "RuntimeError" in observation[0]["content"] and "boom: test" in observation[0]["content"]
    assert not terminated and reward == 0.0
    assert info == {"tool_calls": 1, "tool_errors": 1, "tool_errors/exception": 1}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', "malformed"),
        ('<tool_call>{"name": "subtract", "arguments": {}}</tool_call>', "unknown_tool"),
        (
            '<tool_call>{"name": "add", "arguments": {"a": "one", "b": 2}}</tool_call>',
            "invalid_arguments",
        ),
        ('<tool_call>{"name": "nap", "arguments": {"seconds": 5}}</tool_call>', "timeout"),
    ],
)
def test_bad_tool_calls_become_error_messages_counted_by_kind(calc_env, text, kind):
    calc_env.reset(seed=0)
    observation, _, terminated, truncated, info = calc_env.step(text)
    assert len(observation) == 1 and observation[0]["role"] == "tool"
    assert observation[0]["content"].startswith("Error")
    assert info["tool_errors"] == 1 and info[f"tool_errors/{kind}"] == 1
    assert (terminated, truncated) == (False, False)


def test_several_calls_in_one_turn_each_get_a_message(calc_env, tool_call):
    calc_env.reset(seed=0)
    observation, *_, info = calc_env.step(
        tool_call("add", a=1, b=2) + tool_call("explode", reason="x")
    )
    assert [m["name"] for m in observation] == ["add", "explode"]
    assert observation[0]["content"] == "3"
    assert info == {"tool_calls": 2, "tool_errors": 1, "tool_errors/exception": 1}


def test_reply_without_tool_calls_is_graded_by_answer(calc_env):
    calc_env.reset(seed=1)
    right = str(calc_env.a + calc_env.b)
    assert calc_env.step(f"it is {right}") == (
        [],
        1.0,
        True,
        False,
        {"tool_calls": 0, "tool_errors": 0, "correct": 1.0},
    )


def test_run_tools_returns_messages_with_metrics(calc_env, tool_call):
    message = calc_env.parse_action(tool_call("add", a=1, b=1) + tool_call("nope"))
    results = calc_env.run_tools(message)
    assert results[0]["content"] == "2"
    assert results.metrics == {"tool_calls": 2, "tool_errors": 1, "tool_errors/unknown_tool": 1}
    assert [o.error_kind for o in results.outcomes] == [None, "unknown_tool"]


async def test_arun_tools_runs_on_the_callers_loop(calc_env, tool_call):
    results = await calc_env.arun_tools(calc_env.parse_action(tool_call("add", a=5, b=6)))
    assert results == [
        {"role": "tool", "tool_call_id": results[0]["tool_call_id"], "name": "add", "content": "11"}
    ]


async def test_sync_env_runs_in_the_env_thread_pool(calc_env_cls):
    seen = []

    class Spy(calc_env_cls):
        def reset(self, *, seed=None, options=None):
            seen.append(threading.current_thread().name)
            return super().reset(seed=seed, options=options)

    env = Spy()
    observation, _ = await env.areset(seed=3)
    assert seen[0].startswith("vime-env")
    assert observation == env.reset(seed=3)[0]


async def test_env_thread_pool_size_bounds_concurrent_sync_steps():
    active, peak, lock = 0, 0, threading.Lock()

    class Slow(vime.Env):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return [{"role": "user", "content": "wait"}], {}

        def step(self, action):
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.05)
            with lock:
                active -= 1
            return [], 0.0, True, False, {}

    default = env_threads()
    set_env_threads(2)
    try:
        envs = [Slow() for _ in range(6)]
        await asyncio.gather(*(e.areset() for e in envs))
        await asyncio.gather(*(e.astep("x") for e in envs))
    finally:
        set_env_threads(default)
    assert peak == 2


def test_env_thread_pool_size_must_be_positive():
    with pytest.raises(ValueError, match="max_workers must be >= 1, got 0"):
        set_env_threads(0)


def test_async_native_env_works_through_sync_reset_and_step(async_env_cls):
    env = async_env_cls()
    observation, _ = env.reset(seed=4)
    assert observation[0]["content"].startswith("count down from 3")
    results = [env.step(f"{n}") for n in (2, 1, 0)]
    assert [r[1] for r in results] == [1.0, 1.0, 1.0]
    assert [r[2] for r in results] == [False, False, True]
    env.close()


async def test_async_native_env_sync_calls_also_work_inside_a_running_loop(async_env_cls):
    env = async_env_cls()
    assert env.reset(seed=4)[0] == (await env.areset(seed=4))[0]
    env.close()


def test_an_env_that_used_its_loop_thread_still_pickles(async_env_cls):
    env = async_env_cls()
    env.reset(seed=4)
    env.step("2")
    copy = pickle.loads(pickle.dumps(env))
    assert copy.left == 2 and "_loop" not in vars(copy)
    assert copy.step("1")[1] == 1.0 and env.step("1")[1] == 1.0
    env.close()
    copy.close()


def test_an_env_without_reset_or_step_says_what_to_implement():
    class Empty(vime.Env):
        pass

    with pytest.raises(
        NotImplementedError, match="Empty must implement reset\\(\\) or areset\\(\\)"
    ):
        Empty().reset()
    with pytest.raises(NotImplementedError, match="Empty must implement step\\(\\) or astep\\(\\)"):
        Empty().step("hi")


def test_unknown_tool_parser_is_rejected_at_construction(calc_env_cls):
    with pytest.raises(ValueError, match="no_such_parser"):
        calc_env_cls(tool_parser="no_such_parser")


@pytest.mark.parametrize("env_id", ["vime/Math-v0", "vime/GuessNumber-v0"])
def test_builtin_envs_pass_gymnasiums_check_env(env_id):
    check_env(vime.make(env_id).unwrapped, skip_render_check=True)


def test_tool_env_and_async_env_pass_gymnasiums_check_env(calc_env_cls, async_env_cls):
    check_env(calc_env_cls(), skip_render_check=True)
    check_env(async_env_cls(), skip_render_check=True)
