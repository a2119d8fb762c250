"""The built-in tool agent against the stub engine: exact token records, limits and failures."""

from __future__ import annotations

import pytest
from stub_engine import stub_logprob

from vime.agents import AgentConfig, run
from vime.types import Status

SAMPLING = {"temperature": 1.0, "max_tokens": 200}


def sampled_spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


async def test_token_mode_episode_matches_what_the_engine_saw(
    env_cls, stub, client, renderer, token_config
):
    traj = await run(env_cls(), client, SAMPLING, token_config, renderer=renderer)

    last = stub.requests[-1]
    reply_ids = traj.token_ids[len(last["token_ids"]) :]
    assert traj.token_ids[: len(last["token_ids"])] == last["token_ids"]
    assert reply_ids[-1] == renderer.tokenizer.eos_token_id
    assert len(stub.requests) == 5
    assert traj.status is Status.COMPLETED
    assert traj.reward == 1.0
    assert traj.turn_rewards == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert traj.metrics["drift_count"] == 0
    assert traj.metrics["tool_calls"] == 4


async def test_loss_mask_covers_exactly_the_sampled_ids(
    env_cls, stub, client, renderer, token_config
):
    traj = await run(env_cls(), client, SAMPLING, token_config, renderer=renderer)

    spans = sampled_spans(traj.loss_mask)
    assert len(spans) == 5
    for (start, end), request in zip(spans, stub.requests, strict=True):
        # each sampled span starts right where the prompt sent for that turn ended
        assert start == len(request["token_ids"])
        assert traj.token_ids[end - 1] == renderer.tokenizer.eos_token_id
    assert traj.prompt_length == len(stub.requests[0]["token_ids"])
    assert traj.loss_mask[: traj.prompt_length] == [0] * traj.prompt_length


async def test_logprobs_align_one_to_one_with_sampled_ids(
    env_cls, stub, client, renderer, token_config
):
    traj = await run(env_cls(), client, SAMPLING, token_config, renderer=renderer)

    for i, (tok, m, lp) in enumerate(
        zip(traj.token_ids, traj.loss_mask, traj.logprobs, strict=True)
    ):
        assert lp == (stub_logprob(tok, i) if m else 0.0)
    assert traj.token_versions == [0 if m else -1 for m in traj.loss_mask]
    assert traj.weight_versions == [0] * 5


async def test_env_ids_are_the_template_rendering_of_the_env_messages(
    env_cls, stub, client, renderer, token_config
):
    traj = await run(env_cls(), client, SAMPLING, token_config, renderer=renderer)

    # The whole conversation rendered by the template gives the same ids as the record.
    full = renderer.encode(
        renderer.render(traj.messages, env_cls().tool_schemas, add_generation_prompt=False)
    )
    assert traj.token_ids == full[: len(traj.token_ids)]
    assert renderer.tokenizer.decode(traj.token_ids).count("<tool_response>\n") == 4


async def test_chat_mode_gives_the_same_ids_as_token_mode(env_cls, stub, client, renderer):
    tokens = await run(env_cls(), client, SAMPLING, AgentConfig(mode="tokens"), renderer=renderer)
    chat = await run(env_cls(), client, SAMPLING, AgentConfig(mode="chat"))

    assert chat.metrics["drift_count"] == 0
    assert chat.token_ids == tokens.token_ids
    assert chat.loss_mask == tokens.loss_mask
    assert chat.logprobs == tokens.logprobs
    assert chat.reward == tokens.reward == 1.0


async def test_max_turns_truncates(env_cls, stub, client, renderer):
    traj = await run(env_cls(), client, SAMPLING, AgentConfig(max_turns=2), renderer=renderer)

    assert traj.status is Status.TRUNCATED
    assert traj.metadata["stop_reason"] == "max_turns=2"
    assert traj.metrics["num_turns"] == 2
    assert len(sampled_spans(traj.loss_mask)) == 2


async def test_context_guard_truncates_before_overflowing(env_cls, stub, client, renderer):
    full = await run(env_cls(), client, SAMPLING, AgentConfig(), renderer=renderer)
    limit = len(full.token_ids) - 5  # the last reply (17 ids) gets cut
    stub.requests.clear()
    traj = await run(
        env_cls(), client, SAMPLING, AgentConfig(max_context_tokens=limit), renderer=renderer
    )

    assert traj.status is Status.TRUNCATED
    assert traj.metadata["stop_reason"] == f"context: reached {limit} tokens"
    assert len(traj.token_ids) == limit
    assert traj.reward == 0.0  # the cut reply was never graded
    # every request asked for no more tokens than fit
    assert all(
        len(r["token_ids"]) + r["sampling_params"]["max_tokens"] <= limit for r in stub.requests
    )
    assert stub.requests[-1]["sampling_params"]["max_tokens"] < SAMPLING["max_tokens"]


async def test_context_guard_stops_when_the_prompt_alone_overflows(env_cls, stub, client, renderer):
    full = await run(env_cls(), client, SAMPLING, AgentConfig(), renderer=renderer)
    limit = len(full.token_ids) - 40  # the last prompt no longer fits
    stub.requests.clear()
    traj = await run(
        env_cls(), client, SAMPLING, AgentConfig(max_context_tokens=limit), renderer=renderer
    )

    assert traj.status is Status.TRUNCATED
    assert traj.metadata["stop_reason"].startswith("context: the prompt has ")
    assert len(stub.requests) == 4
    assert traj.metrics["num_turns"] == 4


async def test_engine_error_fails_only_with_the_reason(env_cls, stub, client, renderer):
    def broken(prompt: str) -> str:
        raise RuntimeError("engine exploded")

    stub.policy = broken
    traj = await run(env_cls(), client, SAMPLING, AgentConfig(), renderer=renderer)

    assert traj.status is Status.FAILED
    assert traj.error.startswith("RequestAborted: request aborted (server_error): HTTP 500")
    assert traj.loss_mask == [0] * len(traj.token_ids)


async def test_token_mode_without_renderer_is_a_clear_error(env_cls, client):
    with pytest.raises(ValueError, match="token-in mode needs a ChatTemplateRenderer"):
        await run(env_cls(), client, SAMPLING, AgentConfig(mode="tokens"))


@pytest.mark.parametrize("mode", ["tokens", "chat"])
async def test_weight_versions_come_from_the_engine_header(env_cls, stub, client, renderer, mode):
    stub.weight_version = 7  # sent only as x-vime-weight-version, like the engines' middleware
    traj = await run(env_cls(), client, SAMPLING, AgentConfig(mode=mode), renderer=renderer)

    assert traj.status is Status.COMPLETED
    assert traj.weight_versions == [7] * 5
    sampled = [v for v, m in zip(traj.token_versions, traj.loss_mask, strict=True) if m]
    assert sampled and set(sampled) == {7}


async def test_chat_mode_with_engine_parsed_tool_calls_does_not_drift(
    env_cls, stub, client, renderer
):
    tokens = await run(env_cls(), client, SAMPLING, AgentConfig(mode="tokens"), renderer=renderer)
    stub.parse_tool_calls = True  # like vLLM's --tool-call-parser hermes
    chat = await run(env_cls(), client, SAMPLING, AgentConfig(mode="chat"))

    assert chat.messages[2]["tool_calls"][0]["function"]["name"] == "add"
    assert chat.metrics["drift_count"] == 0
    assert chat.token_ids == tokens.token_ids
    assert chat.reward == 1.0


class GradedOnCut:
    """Mixin: an env that grades episodes the loop cuts short (as RepoFix-v0 does)."""

    async def afinish(self):
        return 0.5, {"graded_on_cut": 1.0}


@pytest.mark.parametrize("limit", ["context", "turns"])
async def test_an_episode_cut_by_the_loop_is_graded_by_an_env_with_afinish(
    env_cls, stub, client, renderer, limit
):
    full = await run(env_cls(), client, SAMPLING, AgentConfig(), renderer=renderer)
    config = (
        AgentConfig(max_context_tokens=len(full.token_ids) - 5)
        if limit == "context"
        else AgentConfig(max_turns=2)
    )
    env = type("Graded", (GradedOnCut, env_cls), {})()
    traj = await run(env, client, SAMPLING, config, renderer=renderer)

    assert traj.status is Status.TRUNCATED
    assert traj.reward == 0.5 and traj.turn_rewards[-1] == 0.5
    assert traj.metrics["graded_on_cut"] == 1.0
