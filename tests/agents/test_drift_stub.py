"""Drift: a template that re-renders earlier replies differently is detected every turn and
handled as configured (mask the unprovable sampled ids, or split into samples)."""

from __future__ import annotations

import pytest
from stub_engine import ByteTokenizer, StubServer, counting_tool_policy

from vime.agents import AgentConfig, ChatTemplateRenderer, TrajectoryBuilder, run, training_samples
from vime.types import Status

SAMPLING = {"max_tokens": 200}


class CompactingTokenizer(ByteTokenizer):
    """Re-renders earlier assistant replies without spaces: what the model sampled as
    ``{"name": "add", ...}`` comes back as ``{"name":"add",...}``."""

    def apply_chat_template(self, messages, tools=None, **kwargs):
        compact = [
            {**m, "content": (m.get("content") or "").replace(" ", "")}
            if m["role"] == "assistant"
            else m
            for m in messages
        ]
        return super().apply_chat_template(compact, tools, **kwargs)


class TurnCountingTokenizer(ByteTokenizer):
    """Not append-only: the system prompt says how many messages follow."""

    def apply_chat_template(self, messages, tools=None, **kwargs):
        head = {"role": "system", "content": f"{len(messages)} messages"}
        return super().apply_chat_template([head, *messages], tools, **kwargs)


@pytest.fixture
async def drifting_stub():
    tokenizer = CompactingTokenizer()
    async with StubServer(tokenizer, counting_tool_policy(turns=5), record_requests=True) as s:
        yield s


@pytest.fixture
async def drifting_client(drifting_stub):
    from vime.inference.client import VimeClient

    async with VimeClient(drifting_stub.url, model="stub") as engine:
        yield engine


def engine_prompt(stub: StubServer, request: dict) -> list[int]:
    text = stub.tokenizer.apply_chat_template(
        request["messages"], request.get("tools"), add_generation_prompt=True
    )
    return stub.tokenizer.encode(text)


async def test_drift_is_detected_and_masked(env_cls, drifting_stub, drifting_client):
    traj = await run(env_cls(), drifting_client, SAMPLING, AgentConfig(mode="chat", drift="mask"))

    assert traj.status is Status.COMPLETED
    assert traj.metrics["drift_count"] == 4  # turns 2..5 each see a rewritten history
    assert traj.metrics["drift_masked_tokens"] > 0
    # Where the rewritten history starts: engine prompt ids from there on, never trained.
    drift_at = traj.metadata["drift_at"]
    assert drift_at == sorted(drift_at) and drift_at[0] >= traj.prompt_length
    assert all(traj.loss_mask[p] == 0 for p in drift_at)
    final_prompt = engine_prompt(drifting_stub, drifting_stub.requests[-1])
    # The record is what the engine saw last, plus the last reply; only provable ids are trained.
    assert traj.token_ids[: len(final_prompt)] == final_prompt
    assert traj.loss_mask[len(final_prompt) :] == [1] * (len(traj.token_ids) - len(final_prompt))
    first_reply = traj.loss_mask.index(1)
    assert first_reply >= traj.prompt_length
    sampled = 0
    for request in drifting_stub.requests:
        reply = drifting_stub.policy(
            drifting_stub.tokenizer.decode(engine_prompt(drifting_stub, request))
        )
        sampled += len(drifting_stub.tokenizer.encode(reply)) + 1
    assert sum(traj.loss_mask) + traj.metrics["drift_masked_tokens"] == sampled
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)


async def test_drift_split_gives_one_provable_sample_per_drift(
    env_cls, drifting_stub, drifting_client
):
    traj = await run(env_cls(), drifting_client, SAMPLING, AgentConfig(mode="chat", drift="split"))

    samples = training_samples(traj)
    assert traj.metrics["drift_count"] == 4
    assert len(samples) == 5
    for sample, request in zip(samples, drifting_stub.requests, strict=True):
        prompt = engine_prompt(drifting_stub, request)
        assert sample.token_ids[: len(prompt)] == prompt
        assert sample.prompt_length == len(prompt)
        assert sample.loss_mask == [0] * len(prompt) + [1] * (len(sample.token_ids) - len(prompt))
        assert sample.reward == 1.0


async def test_token_mode_never_drifts_on_a_history_rewriting_template(
    env_cls, drifting_stub, drifting_client
):
    renderer = ChatTemplateRenderer(CompactingTokenizer())
    traj = await run(
        env_cls(), drifting_client, SAMPLING, AgentConfig(mode="tokens"), renderer=renderer
    )

    last_prompt = drifting_stub.requests[-1]["token_ids"]
    assert traj.metrics["drift_count"] == 0
    assert traj.token_ids[: len(last_prompt)] == last_prompt
    assert traj.loss_mask[len(last_prompt) :] == [1] * (len(traj.token_ids) - len(last_prompt))
    assert traj.reward == 1.0


async def test_non_append_only_template_fails_token_mode_with_the_reason(env_cls, stub, client):
    renderer = ChatTemplateRenderer(TurnCountingTokenizer())
    traj = await run(env_cls(), client, SAMPLING, AgentConfig(mode="tokens"), renderer=renderer)

    assert traj.status is Status.FAILED
    assert traj.error.startswith(
        "TemplateError: the chat template does not render appended messages"
    )


def test_builder_masks_from_the_point_of_divergence():
    builder = TrajectoryBuilder("mask")
    builder.observe_prompt([1, 2, 3])
    builder.add_completion([4, 5], [-0.1, -0.2], 7)
    assert not builder.observe_prompt([1, 2, 3, 4, 9, 9, 10])
    builder.add_completion([11], [-0.3], 8)
    traj = builder.build(messages=[], reward=0.0, turn_rewards=[], status=Status.COMPLETED)

    assert traj.token_ids == [1, 2, 3, 4, 9, 9, 10, 11]
    assert traj.loss_mask == [0, 0, 0, 1, 0, 0, 0, 1]
    assert traj.logprobs == [0.0, 0.0, 0.0, -0.1, 0.0, 0.0, 0.0, -0.3]
    assert traj.token_versions == [-1, -1, -1, 7, -1, -1, -1, 8]
    assert traj.weight_versions == [7, 8]
    assert traj.metrics["drift_masked_tokens"] == 1.0


def test_builder_rejects_misaligned_engine_output():
    builder = TrajectoryBuilder()
    builder.observe_prompt([1])
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        builder.add_completion([2, 3], [-0.5], 0)
    with pytest.raises(ValueError, match="finite and <= 0"):
        builder.add_completion([2], [0.5], 0)
    with pytest.raises(ValueError, match="drift policy must be one of"):
        TrajectoryBuilder("ignore")


def test_builder_tags_tokens_with_the_engines_version_spans():
    builder = TrajectoryBuilder()
    builder.observe_prompt([1, 2])
    # a weight update landed after the engine sampled two of the four ids
    builder.add_completion([3, 4, 5, 6], [-0.1] * 4, None, [(4, 0, 2), (5, 2, 4)])
    traj = builder.build(messages=[], reward=0.0, turn_rewards=[], status=Status.COMPLETED)

    assert traj.token_versions == [-1, -1, 4, 4, 5, 5]
    assert traj.weight_versions == [5]
