"""One step's rollout in the RL loop against a stub engine: over-sampling feeds the group
filter, consumed tasks advance the data stream, and reward metrics cover every episode."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from stub_engine import StubServer

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import VimeError
from vime.orchestration.loop import RLLoop

TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]


def _policy():
    """Even tasks: right on every other sample (informative groups); odd tasks: always wrong."""
    seen: Counter = Counter()

    def reply(prompt: str) -> str:
        i = int(re.findall(r"What is (\d+) \+ 1\?", prompt)[-1])
        seen[i] += 1
        right = i % 2 == 0 and seen[i] % 2 == 1
        return f"\\boxed{{{i + 1 if right else 1000}}}"

    return reply


def _loop(tiny_model: Path, url: str, tmp_path: Path, *flags: str) -> RLLoop:
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0"]
    argv += ["--output-dir", str(tmp_path), "--rollout-batch-size", "2", "--n", "2", *flags]
    setup = build_setup(parse_args(argv))
    cluster = SimpleNamespace(base_url=url, model_name="stub")
    return RLLoop(setup, cluster, logger=None, tasks=TASKS, eval_tasks=[])


def _even_tasks_slow(prompt: str) -> float:
    """Answer the informative (even) tasks a second late, so the always-wrong groups finish
    before the batch fills and nothing is cancelled (without it the count of finished
    episodes depends on scheduling)."""
    i = int(re.findall(r"What is (\d+) \+ 1\?", prompt)[-1])
    return 1.0 if i % 2 == 0 else 0.0


@pytest.fixture
async def stub(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    async with StubServer(tokenizer, _policy()) as server:
        yield server


@pytest.fixture
async def stub_slow_on_even(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    async with StubServer(tokenizer, _policy(), delay=_even_tasks_slow) as server:
        yield server


async def test_over_sampling_gives_the_group_filter_tasks_to_choose_from(
    tiny_model, stub_slow_on_even, tmp_path
):
    flags = ["--over-sampling", "2.0", "--group-filter", "nonzero_reward_variance"]
    loop = _loop(tiny_model, stub_slow_on_even.url, tmp_path, *flags)
    before = loop.stream.position
    groups, metrics, start = await loop.rollout()
    await loop.close()

    assert start == before and loop.stream.position == before + 4  # 2 wanted x 2.0
    assert len(groups) == 2
    assert all(sorted(t.reward for t in g) == [0.0, 1.0] for g in groups)
    assert metrics["rollout/groups_kept"] == 2.0
    # 8 episodes finished, 2 of them right: the kept groups alone would say 0.5.
    assert metrics["rollout/episodes"] == 8.0
    assert metrics["rollout/status_completed"] == 8.0
    assert metrics["rollout/reward_mean"] == pytest.approx(0.25)


async def test_without_over_sampling_a_step_takes_exactly_its_batch(tiny_model, stub, tmp_path):
    loop = _loop(tiny_model, stub.url, tmp_path)
    groups, metrics, _ = await loop.rollout()
    await loop.close()
    assert loop.stream.position == 2 and len(groups) == 2
    assert metrics["rollout/episodes"] == 4.0


async def test_a_step_whose_episodes_all_fail_stops_the_run_with_the_first_error(
    tiny_model, tmp_path
):
    loop = _loop(tiny_model, "http://127.0.0.1:9/v1", tmp_path, "--episode-timeout", "5")
    with pytest.raises(VimeError, match=r"step 1: all 4 episodes failed; the first error"):
        await loop.rollout()
    await loop.close()


def test_the_loop_renders_with_the_renderer_it_is_given_or_loads_the_models(tiny_model, tmp_path):
    # run_training loads the driver's renderer while the engines start and hands it over.
    from vime.orchestration.loop import chat_renderer

    given = chat_renderer(str(tiny_model))
    argv = ["train", "--model", str(tiny_model), "--env", "vime/Math-v0", "--output-dir"]
    setup = build_setup(parse_args([*argv, str(tmp_path)]))
    cluster = SimpleNamespace(base_url="http://127.0.0.1:1/v1", model_name="stub")
    loop = RLLoop(setup, cluster, logger=None, tasks=TASKS, eval_tasks=[], renderer=given)
    assert loop.manager.renderer is given and loop.eval_manager.renderer is given
    own = _loop(tiny_model, "http://127.0.0.1:1/v1", tmp_path)
    assert own.manager.renderer is not given
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    assert own.manager.renderer.prompt_ids(messages) == given.prompt_ids(messages)
