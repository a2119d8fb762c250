"""MaxTurns truncation and wrappers that keep the async API."""

from __future__ import annotations

import gymnasium
import pytest

import vime
from vime.envs.wrappers import MaxTurns, Wrapper


def test_max_turns_truncates_without_terminating():
    env = MaxTurns(vime.make("vime/GuessNumber-v0", max_guesses=10), max_turns=2)
    env.reset(seed=0)
    first = env.step("hello")
    second = env.step("hello")
    assert (first[2], first[3]) == (False, False)
    assert (second[2], second[3]) == (False, True)
    assert second[4]["max_turns_reached"] is True


def test_max_turns_leaves_a_terminated_episode_as_terminated():
    env = vime.make("vime/Math-v0", max_turns=1)
    assert isinstance(env, MaxTurns)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("\\boxed{0}")
    assert (terminated, truncated) == (True, False)
    assert "max_turns_reached" not in info


def test_max_turns_counts_from_each_reset():
    env = vime.make("vime/GuessNumber-v0", max_turns=2)
    env.reset(seed=0)
    env.step("1")
    env.reset(seed=0)
    assert env.step("1")[3] is False


async def test_max_turns_truncates_on_the_async_path_too():
    env = vime.make("vime/GuessNumber-v0", max_turns=1)
    await env.areset(seed=0)
    assert (await env.astep("1"))[3] is True


def test_max_turns_must_be_positive():
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        MaxTurns(vime.make("vime/Math-v0"), 0)


async def test_vime_wrapper_over_a_gymnasium_wrapper_keeps_async_and_tools(calc_env_cls, tool_call):
    inner = gymnasium.wrappers.TransformReward(calc_env_cls(), lambda r: 10 * r)
    env = Wrapper(inner)
    await env.areset(seed=2)
    a, b = env.unwrapped.a, env.unwrapped.b
    assert [s["function"]["name"] for s in env.tool_schemas] == ["add", "explode", "nap"]
    tool_turn = await env.astep(tool_call("add", a=a, b=b))
    assert tool_turn[0][0]["content"] == str(a + b)
    _, reward, terminated, _, _ = await env.astep(f"{a + b}")
    assert (reward, terminated) == (10.0, True)


def test_gymnasium_wrappers_work_on_vime_envs_sync():
    env = gymnasium.wrappers.TimeLimit(vime.make("vime/GuessNumber-v0"), max_episode_steps=1)
    env.reset(seed=0)
    assert env.step("3")[3] is True
