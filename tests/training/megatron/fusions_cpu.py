"""Spawned-process helpers of test_fusions_cpu.py: a train step with fusion counters, and the
RoPE/weight-gradient kernels against megatron-core's unfused code (torch.compile'd kernels stay
out of the pytest process, where they changed later tests' results)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from megatron_cpu import run_one_step

FUSION_SLOTS = (
    ("megatron.core.tensor_parallel.layers", "fused_weight_gradient_mlp_cuda"),
    ("megatron.core.models.common.embeddings.rope_utils", "fused_apply_rotary_pos_emb"),
    ("megatron.core.models.common.embeddings.rope_utils", "fused_apply_rotary_pos_emb_thd"),
)


def _count_fused_calls(trainer: Any) -> dict[str, Any]:
    """Wrap megatron-core's fusion slots so the step records how often each kernel ran."""
    import importlib

    calls: dict[str, int] = {}
    for module_name, slot in FUSION_SLOTS:
        module = importlib.import_module(module_name)
        target = getattr(module, slot, None)
        if target is None:
            continue
        if slot == "fused_weight_gradient_mlp_cuda":
            inner = target.wgrad_gemm_accum_fp32
            target.wgrad_gemm_accum_fp32 = _counted(inner, calls, "wgrad_gemm_accum_fp32")
        else:
            setattr(module, slot, _counted(target, calls, slot))
    # The Triton kernels (CUDA, or the interpreter's CPU run): each autograd Function's forward.
    from vime.training.kernels import qk_norm_rope, rms_norm, rope

    rms_norm._RMSNorm.apply = _counted(rms_norm._RMSNorm.apply, calls, "triton_rms_norm")
    rope._Rope.apply = _counted(rope._Rope.apply, calls, "triton_rope")
    qk = qk_norm_rope._QKNormRope
    qk.apply = _counted(qk.apply, calls, "triton_qk_norm_rope")
    for module in (rms_norm, qk_norm_rope):
        module.norm_weight_grad = _counting_main_grad(module.norm_weight_grad, calls)
    return {"fused_calls": calls}


def _counting_main_grad(fn: Any, calls: dict[str, int]) -> Any:
    """Count the norm weights' gradients the kernels added to megatron's main_grad themselves
    (``main_grad_norms``) and those handed back to autograd (``autograd_norms``)."""

    @functools.wraps(fn)
    def wrapper(weight: Any, partial: Any) -> Any:
        weight.grad_added_to_main_grad = False
        out = fn(weight, partial)
        key = "main_grad_norms" if weight.grad_added_to_main_grad else "autograd_norms"
        calls[key] = calls.get(key, 0) + 1
        return out

    return wrapper


def _counted(fn: Any, calls: dict[str, int], key: str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[key] = calls.get(key, 0) + 1
        return fn(*args, **kwargs)

    return wrapper


def step_with_counts(
    folder: str, args: list[str], token_lists: list[list[int]], per_sequence: bool
) -> dict[str, Any]:
    """One train step (:func:`megatron_cpu.run_one_step`) and how often each fused kernel ran."""
    return run_one_step(
        folder, args, token_lists, per_sequence=per_sequence, watch=_count_fused_calls
    )


# Ops that launch no kernel on CUDA: allocations and metadata.
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach",
              "lift_fresh", "set_", "resize_", "_local_scalar_dense"}  # fmt: skip


def _count_launches(trainer: Any) -> dict[str, Any]:
    """Count, over the train step only, the work that launches a kernel on CUDA: every aten op
    but views and allocations, and every Triton launch (each counted once, the interpreter's
    own torch calls inside it not at all)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    counts = {"aten": 0, "triton": 0}
    by_op: dict[str, int] = {}

    class Count(TorchDispatchMode):
        paused = False
        active = False  # inside the train step

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not Count.paused:
                name = func.overloadpacket.__name__
                view = any(a.alias_info is not None and not a.alias_info.is_write
                           for a in func._schema.returns)  # fmt: skip
                if not view and name not in _NO_KERNEL:
                    counts["aten"] += 1
                    by_op[name] = by_op.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    run = InterpretedFunction.run

    def counted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["triton"] += Count.active
        Count.paused = True
        try:
            return run(self, *args, **kwargs)
        finally:
            Count.paused = False

    InterpretedFunction.run = counted_run
    step = trainer.train_step

    def counted_step(batch: Any) -> Any:
        Count.active = True
        try:
            with Count():
                return step(batch)
        finally:
            Count.active = False

    trainer.train_step = counted_step
    return {"launches": counts, "aten_ops": by_op}


def step_with_launch_counts(
    folder: str, args: list[str], token_lists: list[list[int]], per_sequence: bool
) -> dict[str, Any]:
    """One train step and the launches it made (:func:`_count_launches`)."""
    return run_one_step(folder, args, token_lists, per_sequence=per_sequence, watch=_count_launches)


def grads_with_swiglu_launches(folder: str, args: list[str]) -> tuple:
    """:func:`megatron_cpu.grads_and_outputs` and how many Triton SwiGLU launches it made."""
    from megatron_cpu import grads_and_outputs

    from vime.training.kernels import swiglu

    launches: dict[str, int] = {}
    swiglu._launch = _counted(swiglu._launch, launches, "triton_swiglu")
    return (*grads_and_outputs(folder, args), launches.get("triton_swiglu", 0))


def rope_and_wgrad_kernels() -> dict[str, float]:
    """Max abs differences of the fused kernels from megatron-core's unfused code in fp32:
    RoPE forward and input gradient (bshd, thd with restarts, thd in exact-offset mode, a
    partial rotary dim) and the accumulated weight gradient."""
    from megatron.core.models.common.embeddings import rope_utils

    from vime.training.megatron import fusions

    g = torch.Generator().manual_seed(3)
    out: dict[str, float] = {}

    def compare(name: str, fused: Any, unfused: Any, t: torch.Tensor) -> None:
        a = t.clone().requires_grad_()
        b = t.clone().requires_grad_()
        ya, yb = fused(a), unfused(b)
        w = torch.randn(ya.shape, generator=g)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        out[f"{name}_out"] = float((ya - yb).abs().max())
        out[f"{name}_grad"] = float((a.grad - b.grad).abs().max())
        out[f"{name}_changed"] = float((yb - t).abs().max())  # the rotation did something

    freqs = _freqs(12, 16)
    t = torch.randn(12, 2, 3, 16, generator=g)
    compare(
        "bshd",
        lambda x: fusions.fused_apply_rotary_pos_emb(x, freqs),
        lambda x: rope_utils._apply_rotary_pos_emb_bshd(x, freqs),
        t,
    )
    partial = _freqs(12, 8)
    compare(
        "bshd_partial",
        lambda x: fusions.fused_apply_rotary_pos_emb(x, partial),
        lambda x: rope_utils._apply_rotary_pos_emb_bshd(x, partial),
        t,
    )
    cp = _CpGroup()
    cu = torch.tensor([0, 5, 12, 20], dtype=torch.int32)
    packed = torch.randn(20, 3, 16, generator=g)
    for name, f in (("thd", _freqs(8, 16)), ("thd_offsets", _freqs(20, 16))):
        compare(
            name,
            lambda x, f=f: fusions.fused_apply_rotary_pos_emb_thd(x, cu, f),
            lambda x, f=f: rope_utils._apply_rotary_pos_emb_thd(x, cu, f, cp_group=cp),
            packed,
        )

    x, dy = torch.randn(40, 24, generator=g), torch.randn(40, 56, generator=g)
    start = torch.randn(56, 24, generator=g)
    main = start.clone()
    fusions.wgrad_gemm_accum_fp32(x, dy, main)
    fusions.wgrad_gemm_accum_fp32(x[:7], dy[:7], main)
    expected = start + dy.t() @ x + dy[:7].t() @ x[:7]
    out["wgrad_fp32"] = float((main - expected).abs().max())
    bf = start.clone()
    fusions.wgrad_gemm_accum_fp32(x.bfloat16(), dy.bfloat16(), bf)
    ref = start + (dy.bfloat16().t() @ x.bfloat16()).float()
    out["wgrad_bf16_inputs"] = float((bf - ref).abs().max())
    return out


def _freqs(positions: int, dim: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    f = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    return torch.cat((f, f), dim=-1)[:, None, None, :]


class _CpGroup:
    """A context-parallel group of one, as megatron-core's thd RoPE asks for."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def optimizer_run(
    folder: str, args: list[str], steps: int, save_after: int = 0, load: str = ""
) -> dict[str, Any]:
    """``steps`` Megatron train steps on CPU (clipping active: --clip-grad 0.05 is below the
    gradient norms here); with ``load``, from that checkpoint; with ``save_after`` N, saved
    after step N into ``load``'s folder. Returns each step's loss and grad norm, the masters,
    the model weights, torch's AdamW states, how often the fused kernel launched and how often
    megatron-core's host-read gradient norm ran."""
    from megatron.core.optimizer import optimizer as megatron_optimizer
    from megatron_cpu import cpu_shim, signed_batch

    from vime.training.base import TrainerConfig
    from vime.training.kernels import adamw
    from vime.training.megatron.trainer import MegatronTrainer

    launches = {"adamw": 0, "host_norm": 0}
    adamw._launch = _counted(adamw._launch, launches, "adamw")
    # megatron-core's norm, which reads the norm back to the host before the update
    megatron_optimizer.get_grad_norm_fp32 = _counted(
        megatron_optimizer.get_grad_norm_fp32, launches, "host_norm"
    )
    g = torch.Generator().manual_seed(11)
    batch = signed_batch([torch.randint(0, 96, (n,), generator=g).tolist() for n in (15, 9, 12)])
    with cpu_shim():
        config = TrainerConfig(
            hf_checkpoint=folder, backend="megatron", seed=7, lr=1e-3, clip_grad=0.05,
            weight_decay=0.1,
        )  # fmt: skip
        trainer = MegatronTrainer(config, megatron_args=args)
        if load and not save_after:
            trainer.load(load)
        metrics = []
        for i in range(steps):
            m = trainer.train_step(batch)
            metrics.append((m["loss"], m["grad_norm"]))
            if save_after and i + 1 == save_after:
                trainer.save(load)
        inner = trainer.optimizer.optimizer
        states = [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in inner.state[p].items()}
            for group in inner.param_groups
            for p in group["params"]
        ]
        masters = [p.detach().clone() for group in inner.param_groups for p in group["params"]]
        weights = {n: p.detach().clone() for n, p in trainer.module.named_parameters()}
    return {
        "metrics": metrics,
        "masters": masters,
        "weights": weights,
        "states": states,
        "launches": launches["adamw"],
        "host_norms": launches["host_norm"],
        "fused": trainer._fused_optimizer,
    }
