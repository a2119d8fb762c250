"""The recording openai client: a plain chat.completions loop yields the built-in agent's
trajectory, and misuse of the client gets clear errors."""

from __future__ import annotations

import openai
import pytest

from vime.agents import AgentConfig, run, run_openai_agent
from vime.types import Status

SAMPLING = {"temperature": 1.0, "max_tokens": 200}


def plain_loop(env_cls):
    """An agent that knows nothing about Vime: the openai client and an env, nothing else."""

    async def agent(client: openai.AsyncOpenAI) -> float:
        env = env_cls()
        messages, _ = await env.areset(seed=0)
        total = 0.0
        for _ in range(8):
            response = await client.chat.completions.create(
                model="any", messages=messages, tools=env.tool_schemas, temperature=0.2
            )
            message = response.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            observation, reward, terminated, truncated, _ = await env.astep(message)
            total += reward
            messages.extend(observation)
            if terminated or truncated:
                break
        return total

    return agent


async def test_plain_openai_loop_records_the_builtin_agents_trajectory(
    env_cls, stub, client, renderer
):
    config = AgentConfig(mode="tokens")
    builtin = await run(env_cls(), client, SAMPLING, config, renderer=renderer, seed=0)
    adapted = await run_openai_agent(
        plain_loop(env_cls),
        client,
        SAMPLING,
        config,
        renderer=renderer,
        parse=env_cls().parse_action,
    )

    assert adapted.status is Status.COMPLETED
    assert adapted.reward == builtin.reward == 1.0
    assert adapted.token_ids == builtin.token_ids
    assert adapted.loss_mask == builtin.loss_mask
    assert adapted.logprobs == builtin.logprobs
    assert adapted.prompt_length == builtin.prompt_length
    assert adapted.metrics["drift_count"] == 0


async def test_rollout_sampling_overrides_the_agents_own(env_cls, stub, client, renderer):
    await run_openai_agent(
        plain_loop(env_cls),
        client,
        SAMPLING,
        AgentConfig(),
        renderer=renderer,
        parse=env_cls().parse_action,
    )
    assert {r["sampling_params"]["temperature"] for r in stub.requests} == {1.0}


async def test_agent_that_rewrites_history_is_counted_as_drift(stub, client, renderer):
    async def forgetful(client: openai.AsyncOpenAI) -> float:
        first = [{"role": "user", "content": "Count."}]
        await client.chat.completions.create(model="any", messages=first)
        # drops its own earlier turn and asks again
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Again."}]
        )
        return 0.5

    traj = await run_openai_agent(
        forgetful, client, SAMPLING, AgentConfig(drift="split"), renderer=renderer
    )

    assert traj.metrics["drift_count"] == 1
    assert len(traj.metadata["segments"]) == 1
    assert traj.reward == 0.5
    assert traj.token_ids[: traj.prompt_length] == renderer.prompt_ids(
        [{"role": "user", "content": "Again."}]
    )


async def test_streaming_is_refused_with_a_clear_message(stub, client, renderer):
    async def streamer(client: openai.AsyncOpenAI) -> float:
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return 1.0

    traj = await run_openai_agent(streamer, client, SAMPLING, AgentConfig(), renderer=renderer)
    assert traj.status is Status.FAILED
    assert "stream=True is not supported" in traj.error
    assert stub.requests == []


async def test_agent_exception_fails_the_episode_with_its_reason(stub, client, renderer):
    async def crashing(client: openai.AsyncOpenAI) -> float:
        await client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "hi"}]
        )
        raise KeyError("tool registry")

    traj = await run_openai_agent(crashing, client, SAMPLING, AgentConfig(), renderer=renderer)
    assert traj.status is Status.FAILED
    assert traj.error == "KeyError: 'tool registry'"
    assert traj.num_response_tokens > 0


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/models"])
async def test_other_routes_are_refused(stub, client, renderer, path):
    async def other(client: openai.AsyncOpenAI) -> float:
        if path.endswith("embeddings"):
            await client.embeddings.create(model="any", input="x")
        else:
            await client.models.list()
        return 1.0

    traj = await run_openai_agent(other, client, SAMPLING, AgentConfig(), renderer=renderer)
    assert traj.status is Status.FAILED
    assert "serves only POST /chat/completions" in traj.error
