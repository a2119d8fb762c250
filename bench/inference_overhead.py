"""Inference overhead: tokens/s through vllm-router vs straight to the engine, and weight-update
speed vs a plain memory copy of the same bytes.

One engine serves SmolLM2-135M-Instruct (converted offline) behind the router; the same
requests go alternately through the router and straight to the engine, in the same run.
Then the model's own weights are written to shared memory (a new folder, then the same folder
again in place ``--rewrites`` times, as each sync after the first two does; the best rewrite
after the first, which maps the files that stay mapped from then on) and loaded into the
engine through Vime's update path (pause, load, version, resume), and the same bytes are
copied in memory with torch as the ceiling. On a CPU with oneDNN, the same 2-D weights are
also re-packed the way a CPU engine re-packs its linear layers at every load: the floor under
the engine's side of a sync. Prints a table and writes JSON.

    python bench/inference_overhead.py [--model DIR] [--requests 16] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path


async def _run_batch(base_url: str, model: str, args: argparse.Namespace) -> dict:
    from vime.inference.client import VimeClient

    sem = asyncio.Semaphore(args.concurrency)
    sampling = {"temperature": 0.0, "max_tokens": args.max_tokens}

    async def one(i: int) -> int:
        async with sem:
            r = await client.chat(
                [{"role": "user", "content": f"Write a short story about the number {i}."}],
                sampling=sampling,
                session_id=f"bench-{i}",
                extra_body={"ignore_eos": True},  # every request makes max_tokens tokens
            )
            return len(r.completion_ids)

    async with VimeClient(base_url, model=model, timeout=1800) as client:
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(args.requests))))
        seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def _memcpy_gbps(tensors: dict, repeats: int = 3) -> tuple[int, float]:
    """Bytes of ``tensors`` and the best GB/s of copying them into fresh tensors with torch."""
    import torch

    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    dst = {k: torch.empty_like(t) for k, t in tensors.items()}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for k, t in tensors.items():
            dst[k].copy_(t)
        best = min(best, time.perf_counter() - start)
    return nbytes, nbytes / best / 1e9


def _prepack_gbps(tensors: dict, repeats: int = 3) -> float | None:
    """GB/s of vLLM's CPU oneDNN weight prepack over the 2-D ``tensors``, or None.

    A CPU engine's linear layers keep only this packed copy, so every update re-packs them:
    the floor under the engine's load, whatever the trainer side does. Each handle is dropped
    before its replacement is made, as a reload frees the old one, so the allocator can
    reuse its memory; the first pass (fresh memory) is not counted.
    """
    try:
        import vllm._custom_ops as ops
    except ImportError:
        return None
    if not getattr(ops, "_supports_onednn", False):
        return None
    weights = [t for t in tensors.values() if t.ndim == 2]
    nbytes = sum(t.numel() * t.element_size() for t in weights)
    handles: list[object] = [ops.create_onednn_mm(t.t(), 32) for t in weights]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i, t in enumerate(weights):
            handles[i] = None
            handles[i] = ops.create_onednn_mm(t.t(), 32)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def main() -> None:
    """Run the benchmark and print/write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF folder (default: SmolLM2-135M-Instruct, converted)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="router/direct alternations")
    parser.add_argument("--updates", type=int, default=3, help="weight updates to time")
    parser.add_argument("--rewrites", type=int, default=4, help="in-place rewrites to time")
    parser.add_argument("--out", default="runs/bench/inference_overhead.json")
    args = parser.parse_args()

    from safetensors.torch import load_file

    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService
    from vime.inference.weights import remove_weights, write_weights
    from vime.models.smollm2 import smollm2_path
    from vime.training.buckets import bucket_tensors

    model_dir = Path(args.model) if args.model else smollm2_path(progress=True)
    config = ServeConfig(
        model=str(model_dir),
        rollout_num_engines=1,
        vllm_args=["--enforce-eager", "--max-model-len", "2048", "--dtype", "float32"],
    )
    results: dict = {"model": str(model_dir), "cpu_count": os.cpu_count(), **vars(args)}
    with InferenceService(config) as service:
        engine = service.engine_urls[0] + "/v1"
        asyncio.run(_run_batch(service.base_url, service.model_name, args))  # warm-up
        runs: dict[str, list[dict]] = {"router": [], "direct": []}
        for _ in range(args.rounds):
            runs["router"].append(
                asyncio.run(_run_batch(service.base_url, service.model_name, args))
            )
            runs["direct"].append(asyncio.run(_run_batch(engine, service.model_name, args)))
        tps = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
        results["throughput"] = {"runs": runs, "median_tokens_per_s": tps}
        results["router_overhead_pct"] = 100.0 * (tps["direct"] - tps["router"]) / tps["direct"]

        weights = load_file(str(model_dir / "model.safetensors"))
        start = time.perf_counter()
        folder = write_weights(bucket_tensors(weights.items()))
        write_s = time.perf_counter() - start
        rewrites = []  # again into the same folder: rewritten in place, as each sync does
        for _ in range(args.rewrites):
            start = time.perf_counter()
            write_weights(bucket_tensors(weights.items()), folder)
            rewrites.append(time.perf_counter() - start)
        rewrite_s = min(rewrites[1:] or rewrites)  # the first maps the files it then keeps
        reports = []
        try:
            for _ in range(args.updates):
                reports.append(service.update_weights(folder))
        finally:
            remove_weights(folder)
    nbytes, memcpy = _memcpy_gbps(weights)
    prepack = _prepack_gbps(weights)
    best = min(reports, key=lambda r: r.total_s)
    results["weight_update"] = {
        "bytes": best.bytes_loaded,
        "write_to_shm_s": write_s,
        "rewrite_in_place_s": rewrite_s,
        "rewrites_s": rewrites,
        "rewrite_gbps": nbytes / rewrite_s / 1e9,
        "update_total_s": [r.total_s for r in reports],
        "best": {"pause_s": best.pause_s, "load_s": best.load_s, "resume_s": best.resume_s},
        "update_gbps": best.bytes_loaded / best.total_s / 1e9,
        "load_only_gbps": best.bytes_loaded / best.load_s / 1e9,
        "memcpy_bytes": nbytes,
        "memcpy_gbps": memcpy,
        "onednn_prepack_gbps": prepack,
    }

    wu = results["weight_update"]
    rows = [
        ("tokens/s through router (median)", f"{tps['router']:.1f}"),
        ("tokens/s straight to engine (median)", f"{tps['direct']:.1f}"),
        ("router overhead", f"{results['router_overhead_pct']:+.1f} %"),
        ("weights (bytes)", f"{wu['bytes']:,}"),
        ("write to /dev/shm, new folder", f"{write_s:.2f} s"),
        (
            "  again, in place (each sync)",
            f"{rewrite_s:.3f} s, {nbytes / rewrite_s / 1e9:.2f} GB/s",
        ),
        ("  in place, share of a plain memory copy", f"{nbytes / rewrite_s / 1e9 / memcpy:.0%}"),
        ("weight update, best (pause+load+resume)", f"{best.total_s:.2f} s"),
        ("weight update throughput", f"{wu['update_gbps']:.2f} GB/s"),
        ("  load phase only", f"{wu['load_only_gbps']:.2f} GB/s"),
        ("plain memory copy, same bytes", f"{memcpy:.2f} GB/s"),
    ]
    if prepack is not None:
        rows.append(
            (
                "oneDNN prepack of the 2-D weights",
                f"{prepack:.2f} GB/s, {prepack / memcpy:.0%} of the copy",
            )
        )
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"results written to {out}")


if __name__ == "__main__":
    main()
