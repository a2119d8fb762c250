"""AdamW over many tensors in one Triton launch, with gradient clipping and the low-precision
model copy in the same pass.

Megatron's mixed-precision step makes three passes over memory without Apex: clip (scale every
gradient), torch's fused AdamW on the fp32 master weights, then a copy of the masters into the
bf16 model weights. This kernel reads the gradient, master and both moments once, and writes
master, moments and the model copy once. A table of pointers (one row per tensor) and a
block-to-tensor map let one launch cover a whole parameter group.

The update is AdamW with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization"), with bias-corrected moments, in fp32::

    g = grad * grad_scale
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    p = p * (1 - lr * weight_decay)
    p = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
    model = p rounded to the model's dtype
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vime.training.kernels import runs_here

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - torch wheels for CUDA ship Triton
    triton = None

BLOCK = 4096  # elements of one tensor per program: 4 x 16 KiB of fp32 loads


@dataclass(frozen=True)
class AdamWHyper:
    """One parameter group's AdamW settings at this step (``step`` counts from 1)."""

    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    step: int
    # A float, or a one-element fp32 tensor on the parameters' device that the kernel reads
    # itself: a clipping factor computed on the GPU needs no host read before the step.
    grad_scale: float | torch.Tensor = 1.0


def adamw_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    model_params: list[torch.Tensor] | None,
    hyper: AdamWHyper,
) -> None:
    """Update fp32 ``params`` and their moments in place from fp32 ``grads`` (scaled by
    ``hyper.grad_scale``, a float or a one-element device tensor, on the fly), and write each
    result, rounded, into the matching ``model_params`` tensor when given (all bf16, or all
    fp16). One Triton launch on CUDA (or under Triton's interpreter); the same math in torch
    elsewhere."""
    lists = [params, grads, exp_avgs, exp_avg_sqs] + ([model_params] if model_params else [])
    _check(lists, hyper)
    if not params:
        return
    if triton is not None and all(runs_here(p) for p in params):
        _launch(lists, hyper)
    else:
        _torch_step(params, grads, exp_avgs, exp_avg_sqs, model_params, hyper)


def _scales(grad_scale: float | torch.Tensor) -> bool:
    """Whether ``grad_scale`` may change a gradient (a tensor's value is not read here)."""
    return isinstance(grad_scale, torch.Tensor) or grad_scale != 1.0


def _check(lists: list[list[torch.Tensor]], hyper: AdamWHyper) -> None:
    if hyper.step < 1:
        raise ValueError(f"AdamW step counts from 1, got {hyper.step}")
    scale, first = hyper.grad_scale, lists[0][0] if lists[0] else None
    if (
        isinstance(scale, torch.Tensor)
        and first is not None
        and (scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != first.device)
    ):
        raise ValueError(
            f"AdamW grad_scale as a tensor must be one fp32 value on {first.device}; "
            f"got {scale.dtype}, {scale.numel()} elements, on {scale.device}"
        )
    if len({len(x) for x in lists}) != 1:
        raise ValueError(f"AdamW tensor lists differ in length: {[len(x) for x in lists]}")
    names = ("param", "grad", "exp_avg", "exp_avg_sq", "model param")
    for i, row in enumerate(zip(*lists, strict=True)):
        for name, t in zip(names, row, strict=False):
            if t.shape != row[0].shape:
                raise ValueError(f"AdamW {name} {i} has shape {tuple(t.shape)}, its param "
                                 f"{tuple(row[0].shape)}")  # fmt: skip
            if not t.is_contiguous() or t.device != row[0].device:
                raise ValueError(f"AdamW {name} {i} must be contiguous and on {row[0].device}")
            if name != "model param" and t.dtype != torch.float32:
                raise ValueError(f"AdamW {name} {i} is {t.dtype}; the kernel takes fp32 states")
    if len(lists) == 5:
        dtypes = {t.dtype for t in lists[4]}
        if len(dtypes) != 1 or not dtypes <= set(_MODEL_DTYPES):
            raise ValueError(
                f"AdamW model params must share one dtype of bf16, fp16; got {sorted(map(str, dtypes))}"
            )


def _torch_step(params, grads, exp_avgs, exp_avg_sqs, model_params, h: AdamWHyper) -> None:
    bc1 = 1.0 - h.beta1**h.step
    bc2_sqrt = (1.0 - h.beta2**h.step) ** 0.5
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, strict=True)):
        g = g * h.grad_scale if _scales(h.grad_scale) else g
        m.mul_(h.beta1).add_(g, alpha=1.0 - h.beta1)
        v.mul_(h.beta2).addcmul_(g, g, value=1.0 - h.beta2)
        p.mul_(1.0 - h.lr * h.weight_decay)
        p.addcdiv_(m, v.sqrt().div_(bc2_sqrt).add_(h.eps), value=-h.lr / bc1)
        if model_params:
            model_params[i].copy_(p)


# -- the kernel ---------------------------------------------------------------------------
_MODEL_DTYPES = {torch.bfloat16: 0, torch.float16: 1}


@dataclass
class _Plan:
    """Device tables of one list of tensors: pointers per tensor, and per program its tensor
    and first element. The block tables depend on the sizes only; the pointer table is
    rebuilt when a tensor moves (the torch backend's gradients are new tensors each step, a
    checkpoint load replaces states), copied to the device without waiting for it."""

    sizes_key: tuple
    pointers_key: tuple
    pointers: torch.Tensor  # [5, n] int64 (the model row is unused without a model copy)
    sizes: torch.Tensor  # [n] int64
    block_tensor: torch.Tensor  # [programs] int32
    block_start: torch.Tensor  # [programs] int64
    aligned: bool  # every tensor starts on a 16-byte boundary


_plans: dict[tuple, _Plan] = {}


def _plan(lists: list[list[torch.Tensor]]) -> _Plan:
    pointers_key = tuple(t.data_ptr() for x in lists for t in x)
    sizes_key = tuple(p.numel() for p in lists[0])
    slot = (len(lists), lists[0][0].data_ptr(), sizes_key)
    plan = _plans.get(slot)
    if plan is not None and plan.pointers_key == pointers_key:
        return plan
    device = lists[0][0].device
    rows = [[t.data_ptr() for t in x] for x in lists]
    while len(rows) < 5:
        rows.append(rows[0])
    pointers = torch.tensor(rows, dtype=torch.int64)
    if device.type == "cuda":  # from pinned memory: no wait for the queued backward
        pointers = pointers.pin_memory().to(device, non_blocking=True)
    aligned = all(ptr % 16 == 0 for row in rows for ptr in row)
    if plan is not None:
        plan.pointers_key, plan.pointers, plan.aligned = pointers_key, pointers, aligned
        return plan
    sizes = torch.tensor(sizes_key, dtype=torch.int64)
    blocks = (sizes + BLOCK - 1) // BLOCK
    block_tensor = torch.repeat_interleave(torch.arange(len(sizes)), blocks)
    first = torch.cumsum(blocks, 0) - blocks
    block_start = (torch.arange(int(blocks.sum())) - first[block_tensor]) * BLOCK
    plan = _Plan(
        sizes_key,
        pointers_key,
        pointers,
        sizes.to(device),
        block_tensor.to(device=device, dtype=torch.int32),
        block_start.to(device),
        aligned,
    )
    if len(_plans) > 16:  # a few groups per optimizer; never grow without bound
        _plans.clear()
    _plans[slot] = plan
    return plan


def _launch(lists: list[list[torch.Tensor]], h: AdamWHyper) -> None:
    plan = _plan(lists)
    n = len(lists[0])
    write_model = len(lists) == 5
    model_dtype = _MODEL_DTYPES[lists[4][0].dtype] if write_model else 0
    programs = plan.block_tensor.numel()
    in_memory = isinstance(h.grad_scale, torch.Tensor)
    _adamw_kernel[(programs,)](
        plan.pointers, n, plan.sizes, plan.block_tensor, plan.block_start,
        h.lr, h.weight_decay, h.beta1, h.beta2, h.eps,
        1.0 - h.beta1**h.step, (1.0 - h.beta2**h.step) ** 0.5,
        1.0 if in_memory else h.grad_scale, h.grad_scale if in_memory else lists[0][0],
        WRITE_MODEL=write_model, MODEL_DTYPE=model_dtype, ALIGNED=plan.aligned,
        SCALE_IN_MEMORY=in_memory, BLOCK=BLOCK, num_warps=8,
    )  # fmt: skip


if triton is not None:

    @triton.jit
    def _adamw_kernel(
        pointers, n, sizes, block_tensor, block_start,
        lr, weight_decay, beta1, beta2, eps, bc1, bc2_sqrt, grad_scale, scale_ptr,
        WRITE_MODEL: tl.constexpr, MODEL_DTYPE: tl.constexpr, ALIGNED: tl.constexpr,
        SCALE_IN_MEMORY: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        if SCALE_IN_MEMORY:  # a clipping factor the GPU computed: read here, not on the host
            grad_scale = tl.load(scale_ptr)
        t = tl.load(block_tensor + pid)
        start = tl.multiple_of(tl.load(block_start + pid), BLOCK)
        size = tl.load(sizes + t)
        offs = start + tl.arange(0, BLOCK)
        f32 = tl.pointer_type(tl.float32)
        dtype: tl.constexpr = tl.bfloat16 if MODEL_DTYPE == 0 else tl.float16
        p_ptr = tl.load(pointers + t).to(f32)
        g_ptr = tl.load(pointers + n + t).to(f32)
        m_ptr = tl.load(pointers + 2 * n + t).to(f32)
        v_ptr = tl.load(pointers + 3 * n + t).to(f32)
        w_ptr = tl.load(pointers + 4 * n + t).to(tl.pointer_type(dtype))
        if ALIGNED:  # every tensor starts on 16 bytes (checked on the host): vector loads
            p_ptr = tl.multiple_of(p_ptr, 16)
            g_ptr = tl.multiple_of(g_ptr, 16)
            m_ptr = tl.multiple_of(m_ptr, 16)
            v_ptr = tl.multiple_of(v_ptr, 16)
            w_ptr = tl.multiple_of(w_ptr, 16)
        # A mask of unknown length stops vector loads: only a tensor's last block takes one.
        if start + BLOCK <= size:
            _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, offs, size, lr, weight_decay,
                         beta1, beta2, eps, bc1, bc2_sqrt, grad_scale, WRITE_MODEL, False)  # fmt: skip
        else:
            _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, offs, size, lr, weight_decay,
                         beta1, beta2, eps, bc1, bc2_sqrt, grad_scale, WRITE_MODEL, True)  # fmt: skip

    @triton.jit
    def _adamw_block(
        p_ptr, g_ptr, m_ptr, v_ptr, w_ptr, offs, size,
        lr, weight_decay, beta1, beta2, eps, bc1, bc2_sqrt, grad_scale,
        WRITE_MODEL: tl.constexpr, MASKED: tl.constexpr,
    ):  # fmt: skip
        if MASKED:
            mask = offs < size
            g = tl.load(g_ptr + offs, mask=mask, other=0.0)
            m = tl.load(m_ptr + offs, mask=mask, other=0.0)
            v = tl.load(v_ptr + offs, mask=mask, other=0.0)
            p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        else:
            mask = None
            g = tl.load(g_ptr + offs)
            m = tl.load(m_ptr + offs)
            v = tl.load(v_ptr + offs)
            p = tl.load(p_ptr + offs)
        g = g * grad_scale
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        p = p * (1.0 - lr * weight_decay)
        p = p - (lr / bc1) * m / (tl.sqrt(v) / bc2_sqrt + eps)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(p_ptr + offs, p, mask=mask)
        if WRITE_MODEL:
            tl.store(w_ptr + offs, p.to(w_ptr.dtype.element_ty), mask=mask)
