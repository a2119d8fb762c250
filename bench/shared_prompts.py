"""Torch-trainer steps on GRPO-shaped batches with and without ``--share-prompts``, side by side.

A random Qwen3-0.6B-shaped model (bf16, tied embeddings); each batch holds ``--groups``
prompts of ``--prompt-len`` tokens with ``--n`` completions of 500-3,000 tokens each. Each row
builds a fresh trainer, runs one warm-up step, then times ``--steps`` steps. ``--sdpa`` picks
the attention kernels of each row: the trainer's own (``vime``: flash, and cuDNN for sequences
of ``vime.training.attention.CUDNN_FROM`` tokens or more), ``flash`` only, or ``cudnn`` first
at every length. Needs a GPU.

    python bench/shared_prompts.py --prompt-lens 256,2048 --sdpa vime,cudnn --out shared_prompts.json
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vime.training.batch import TrainBatch


def grpo_batch(seed: int, prompt_len: int, groups: int, n: int, vocab: int) -> TrainBatch:
    """``groups`` random prompts with ``n`` random completions each, advantages +1/-1."""
    from vime.training.batch import TrainBatch, TrainSample

    rng = random.Random(seed)
    samples = []
    for _ in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        for k in range(n):
            response = [rng.randrange(vocab) for _ in range(rng.randint(500, 3000))]
            mask = [0] * prompt_len + [1] * len(response)
            adv = 1.0 if k % 2 else -1.0
            samples.append(
                TrainSample(prompt + response, mask, [adv * m for m in mask], [-m for m in mask])
            )
    return TrainBatch(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lens", default="256,2048", help="comma-separated")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=16384)
    parser.add_argument(
        "--sdpa",
        default="vime",
        help="comma-separated SDPA kernel choices to run rows with: vime (the trainer's own: "
        "flash, cuDNN for long sequences), flash (never cuDNN), cudnn (cuDNN first)",
    )
    parser.add_argument("--out", default="shared_prompts.json")
    args = parser.parse_args()

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vime.training import attention
    from vime.training.base import TrainerConfig
    from vime.training.torch_backend import TorchTrainer

    choices = {  # CUDA_SDPA_BACKENDS, CUDNN_FROM
        "vime": (attention.CUDA_SDPA_BACKENDS, attention.CUDNN_FROM),
        "flash": (attention.CUDA_SDPA_BACKENDS, None),
        "cudnn": (attention.cudnn_first(), attention.CUDNN_FROM),
    }
    sdpas = [x for x in args.sdpa.split(",") if x]
    if not sdpas or any(x not in choices for x in sdpas):
        raise SystemExit(f"--sdpa {args.sdpa!r}: choose from {', '.join(choices)}")
    if not torch.cuda.is_available():
        raise SystemExit("bench/shared_prompts.py needs a GPU")
    folder = tempfile.mkdtemp()
    torch.manual_seed(0)
    shape = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(shape).to(torch.bfloat16).save_pretrained(folder)
    rows = []
    cases = [
        (int(p), sdpa, share)
        for p in args.prompt_lens.split(",")
        for sdpa in sdpas
        for share in (False, True)
    ]
    for prompt_len, sdpa, share in cases:
        attention.CUDA_SDPA_BACKENDS, attention.CUDNN_FROM = choices[sdpa]
        config = TrainerConfig(
            hf_checkpoint=folder,
            lr=1e-6,
            dtype="bfloat16",
            max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
            share_prompts=share,
        )
        trainer = TorchTrainer(config)
        batches = [
            grpo_batch(s, prompt_len, args.groups, args.n, shape.vocab_size)
            for s in range(args.steps + 1)
        ]
        trainer.train_step(batches[0])
        times, metrics = [], {}
        for batch in batches[1:]:
            torch.cuda.synchronize()
            start = time.perf_counter()
            metrics = trainer.train_step(batch)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "prompt_len": prompt_len,
                "sdpa": sdpa,
                "share_prompts": share,
                "tokens": metrics["num_tokens"],
                "packed_tokens": metrics["num_packed_tokens"],
                "step_s": times,
                "tok_per_s": metrics["num_tokens"] / min(times),
                "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
                "loss": metrics["loss"],
                "grad_norm": metrics["grad_norm"],
            }
        )
        del trainer
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    print(
        f"{'prompt':>6} {'sdpa':>6} {'shared':>6} {'tokens':>8} {'packed':>8} {'tok/s':>8} "
        f"{'x':>6} {'GB':>5}"
    )
    for row in rows:
        # The ratio is against the first row of its prompt length: unshared, the first --sdpa.
        base = next(r for r in rows if r["prompt_len"] == row["prompt_len"])
        print(
            f"{row['prompt_len']:>6} {row['sdpa']:>6} {row['share_prompts']!s:>6} "
            f"{row['tokens']:>8.0f} "
            f"{row['packed_tokens']:>8.0f} {row['tok_per_s']:>8.0f} "
            f"{row['tok_per_s'] / base['tok_per_s']:>5.2f}x {row['peak_gb']:>5.1f}"
        )
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
