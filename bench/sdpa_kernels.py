"""SDPA's flash and cuDNN kernels side by side on the trainers' attention shapes: causal, bf16,
grouped key/value heads read as they are, forward + backward of one sequence per call.

For each length: flash's time per call, cuDNN's first call at that length (the plan it
builds for a new shape, forward and backward), and cuDNN's time per call once planned; which
kernels ran comes from the profiler, so a backend that SDPA silently skipped shows. These are
the numbers behind ``vime.training.attention.CUDA_SDPA_BACKENDS`` and ``CUDNN_FROM``. Needs a
GPU.

    python bench/sdpa_kernels.py --lengths 512,1024,2048,4096,8192 --out sdpa_kernels.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def _call(q: Any, k: Any, v: Any, grad: Any) -> None:
    import torch.nn.functional as F

    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)


def _timed(fn: Any, reps: int) -> float:
    """Milliseconds per call of ``fn`` (synchronised), the best of three rounds of ``reps``."""
    import torch

    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1e3 / reps)
    return best


def _kernels(fn: Any) -> str:
    """The attention kernels one call of ``fn`` ran (profiler names, shortened)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
    names = {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}
    keep = [n for n in names if any(w in n.lower() for w in ("flash", "fmha", "cudnn", "attn"))]
    return "; ".join(sorted(n[:60] for n in keep)) or "none found"


def measure(length: int, heads: int, groups: int, dim: int, reps: int) -> dict[str, Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def tensor(h: int) -> torch.Tensor:
        x = torch.randn(1, h, length, dim, device="cuda", dtype=torch.bfloat16)
        return x.requires_grad_()

    q, k, v = tensor(heads), tensor(groups), tensor(groups)
    grad = torch.randn_like(q)
    row: dict[str, Any] = {"length": length}
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ):
        with sdpa_kernel([backend]):
            torch.cuda.synchronize()
            start = time.perf_counter()
            _call(q, k, v, grad)
            torch.cuda.synchronize()
            row[f"{name}_first_ms"] = (time.perf_counter() - start) * 1e3
            row[f"{name}_ms"] = _timed(lambda: _call(q, k, v, grad), reps)
            row[f"{name}_kernels"] = _kernels(lambda: _call(q, k, v, grad))
    row["plan_ms"] = row["cudnn_first_ms"] - row["cudnn_ms"]
    row["saved_ms"] = row["flash_ms"] - row["cudnn_ms"]
    row["calls_to_repay"] = row["plan_ms"] / row["saved_ms"] if row["saved_ms"] > 0 else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192", help="comma-separated")
    parser.add_argument("--heads", type=int, default=16, help="query heads (Qwen3-1.7B: 16)")
    parser.add_argument("--groups", type=int, default=8, help="key/value heads (Qwen3-1.7B: 8)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="sdpa_kernels.json")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/sdpa_kernels.py needs a CUDA device")
    lengths = [int(x) for x in args.lengths.split(",") if x]
    _call(*(torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)), torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16))  # fmt: skip
    rows = [measure(n, args.heads, args.groups, args.head_dim, args.reps) for n in lengths]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{args.heads}/{args.groups} heads of {args.head_dim}, bf16, causal, fwd+bwd")  # fmt: skip
    print(
        "| tokens | flash ms | cuDNN ms | cuDNN x | cuDNN first call ms | plan ms | calls to repay |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        repay = f"{r['calls_to_repay']:.0f}" if r["calls_to_repay"] else "never"
        print(f"| {r['length']:,} | {r['flash_ms']:.3f} | {r['cudnn_ms']:.3f} | "
              f"{r['flash_ms'] / r['cudnn_ms']:.2f}x | {r['cudnn_first_ms']:.1f} | "
              f"{r['plan_ms']:.1f} | {repay} |")  # fmt: skip
    for r in rows:
        print(f"{r['length']}: flash ran {r['flash_kernels']}; cudnn ran {r['cudnn_kernels']}")
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "args": vars(args), "rows": rows}, f,
                  indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
