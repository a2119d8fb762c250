"""Megatron backend vs transformers: logprobs of one random-weight HF checkpoint, fp32 and bf16.

Writes a Qwen3-shaped random model as an HF folder, loads it into both, and compares the
per-token logprobs of a packed batch (several sequences in one micro-batch) against HF run on
each sequence alone. Also checks that ``export_weights`` gives back the loaded HF tensors and
that a distributed-optimizer train step, save and load resume exactly.

    python bench/megatron_logprobs.py --model qwen3-0.6b --out logprobs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def hf_logprobs(model: Any, sequences: list[list[int]]) -> list[Any]:
    """Per-token logprobs (entry 0 is 0.0) of each sequence run alone through an HF model."""
    import torch

    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device="cuda")
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append(torch.cat([lp.new_zeros(1), lp]).cpu())
    return out


def diff(a: list[Any], b: list[Any]) -> dict[str, float]:
    """Max and mean absolute difference over every predicted token."""
    import torch

    d = torch.cat([(x[1:] - y[1:]).abs() for x, y in zip(a, b, strict=True)])
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean())}


def main() -> None:
    """Run the comparison and print a table."""
    import torch
    from qwen3_shapes import qwen3_config
    from train_mfu import make_batch
    from transformers import AutoModelForCausalLM

    from vime.training.base import TrainerConfig
    from vime.training.batch import TrainBatch, TrainSample
    from vime.training.megatron.trainer import MegatronTrainer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.6b")
    p.add_argument("--out", default="")
    args = p.parse_args()
    report: dict[str, Any] = {"model": args.model}
    tmp = Path(tempfile.mkdtemp())
    folder = tmp / "hf"
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = AutoModelForCausalLM.from_config(
            qwen3_config(args.model), dtype=torch.float32, attn_implementation="sdpa"
        )
    hf.save_pretrained(str(folder))
    g = torch.Generator().manual_seed(1)
    lengths = [2000, 1024, 700, 300]
    sequences = [torch.randint(0, 151936, (n,), generator=g).tolist() for n in lengths]
    batch = TrainBatch(
        [
            TrainSample(
                token_ids=seq,
                loss_mask=[0] * len(seq),
                advantages=[0.0] * len(seq),
                rollout_logprobs=[0.0] * len(seq),
            )
            for seq in sequences
        ]
    )
    ref32 = hf_logprobs(hf, sequences)
    hf.to(torch.bfloat16)
    ref16 = hf_logprobs(hf, sequences)
    hf_state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    del hf
    torch.cuda.empty_cache()
    report["hf_bf16_vs_hf_fp32"] = diff(ref16, ref32)

    for dtype in ("float32", "bfloat16"):
        config = TrainerConfig(
            hf_checkpoint=str(folder),
            backend="megatron",
            dtype=dtype,
            max_tokens_per_micro_batch=4096,
        )
        trainer = MegatronTrainer(config, role="reference")
        mine = trainer.compute_logprobs(batch)
        ref = ref32 if dtype == "float32" else ref16
        report[f"megatron_{dtype}_vs_hf_{dtype}"] = diff(mine, ref)
        report[f"megatron_{dtype}_vs_hf_float32"] = diff(mine, ref32)
        if dtype == "bfloat16":
            exported = {n: t for bucket in trainer.export_weights() for n, t in bucket}
            same = all(
                torch.equal(exported[n], hf_state[n].to(exported[n].device)) for n in exported
            )
            report["export_equals_hf_bf16"] = same and set(exported) <= set(hf_state)
            report["export_names"] = len(exported)
        del trainer
        torch.cuda.empty_cache()

    # Actor: a distributed-optimizer step, save, step; load, step again -> same metrics.
    config = TrainerConfig(
        hf_checkpoint=str(folder), backend="megatron", lr=1e-5, max_tokens_per_micro_batch=4096
    )
    actor = MegatronTrainer(config, megatron_args=["--bf16", "--use-distributed-optimizer"])
    train = make_batch(4, 1024, 151936)
    start = time.perf_counter()
    first = actor.train_step(train)
    actor.save(tmp / "ckpt")
    after = actor.train_step(train)
    actor.load(tmp / "ckpt")
    again = actor.train_step(train)
    report["actor_step"] = {
        "first_loss": first["loss"],
        "first_grad_norm": first["grad_norm"],
        "resumed_equal": after["loss"] == again["loss"]
        and after["grad_norm"] == again["grad_norm"],
        "after_grad_norm": after["grad_norm"],
        "again_grad_norm": again["grad_norm"],
        "seconds": time.perf_counter() - start,
    }
    print(
        f"\nlogprobs, {args.model}-shaped random model, {len(lengths)} sequences "
        f"({sum(lengths)} tokens) packed in one micro-batch"
    )
    print(f"{'comparison':34} {'max |diff|':>12} {'mean |diff|':>12}")
    for key, value in report.items():
        if isinstance(value, dict) and "max_abs" in value:
            print(f"{key:34} {value['max_abs']:12.3e} {value['mean_abs']:12.3e}")
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
