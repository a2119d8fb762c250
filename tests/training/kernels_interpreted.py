"""Checks of the Triton kernels (vime.training.kernels) run by test_kernels.py in a child process
with TRITON_INTERPRET=1, so the kernels execute on the CPU. Each check returns the max abs
differences from a float64 reference of the unfused math, by case."""

from __future__ import annotations

import json
import os
import sys
import types

import torch
import torch.nn.functional as F


def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def rms_norm_cases() -> dict[str, float]:
    """Forward values and both gradients against float64 (fp32 inputs) and against
    ``F.rms_norm`` (bf16 inputs), over widths that are and are not powers of two, more rows than
    one program's tile, a non-contiguous input and 3-D/4-D shapes."""
    from vime.training.kernels.rms_norm import _RMSNorm, available, rms_norm

    g = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    launched = []
    apply = _RMSNorm.apply
    _RMSNorm.apply = lambda *a: launched.append(1) or apply(*a)  # type: ignore[method-assign]
    shapes = {
        "rows": (300, 128),
        "odd_width": (37, 96),
        "wide": (3, 5, 640),
        "heads": (2, 7, 4, 16),
    }
    for name, shape in shapes.items():
        x = torch.randn(*shape, generator=g)
        w = 1 + 0.1 * torch.randn(shape[-1], generator=g)
        dy = torch.randn(*shape, generator=g)
        for dtype in (torch.float32, torch.bfloat16):
            xa = x.to(dtype, copy=True).requires_grad_()
            wa = w.to(dtype, copy=True).requires_grad_()
            assert available(xa)
            y = rms_norm(xa, wa, 1e-6)
            (y * dy.to(dtype)).sum().backward()
            tag = f"{name}_{str(dtype)[6:]}"
            if dtype == torch.float32:
                xr = x.double().requires_grad_()
                wr = w.double().requires_grad_()
                (_rms_reference(xr, wr, 1e-6) * dy.double()).sum().backward()
                ref_y, ref_dx, ref_dw = _rms_reference(xr, wr, 1e-6), xr.grad, wr.grad
            else:
                xr = x.to(dtype, copy=True).requires_grad_()
                wr = w.to(dtype, copy=True).requires_grad_()
                ref = F.rms_norm(xr, (shape[-1],), wr, 1e-6)
                (ref * dy.to(dtype)).sum().backward()
                ref_y, ref_dx, ref_dw = ref, xr.grad, wr.grad
            scale = float(ref_dw.abs().max())
            out[f"{tag}_y"] = float((y.detach().double() - ref_y.detach().double()).abs().max())
            out[f"{tag}_dx"] = float((xa.grad.double() - ref_dx.double()).abs().max())
            out[f"{tag}_dw_rel"] = float((wa.grad.double() - ref_dw.double()).abs().max()) / scale
    # A transposed (non-contiguous) input normalises its rows all the same.
    base = torch.randn(16, 300, generator=g)
    w = torch.ones(16)
    out["strided_y"] = float(
        (rms_norm(base.t(), w, 1e-6) - _rms_reference(base.t(), w, 1e-6)).abs().max()
    )
    out["launches"] = float(len(launched))
    return out


def rope_cases() -> dict[str, float]:
    """The kernel's rotation and its gradient against float64 math: full and partial rotary
    width, per-token positions (packed sequences restarting at 0) and positions = row index."""
    from vime.training.kernels.rope import rotate

    g = torch.Generator().manual_seed(1)
    out: dict[str, float] = {}

    def reference(t: torch.Tensor, angles: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        a = angles.double()[pos][:, None, :]
        rot = a.shape[-1]
        half = rot // 2
        t1, t2, rest = t[..., :half], t[..., half:rot], t[..., rot:]
        c, s = a.cos(), a.sin()
        y1 = t1 * c[..., :half] - t2 * s[..., :half]
        y2 = t2 * c[..., half:] + t1 * s[..., half:]
        return torch.cat((y1, y2, rest), dim=-1)

    for name, (tokens, heads, dim, rot) in {
        "full": (20, 3, 16, 16),
        "partial": (9, 5, 24, 8),
    }.items():
        angles = torch.rand(32, rot, generator=g) * 6  # halves differ: the general rotation
        t = torch.randn(tokens, heads, dim, generator=g)
        dy = torch.randn(tokens, heads, dim, generator=g)
        for pos_name, pos in (
            ("index", None),
            ("packed", torch.tensor([i % 7 for i in range(tokens)])),
        ):
            ta = t.clone().requires_grad_()
            y = rotate(ta, angles, pos)
            (y * dy).sum().backward()
            positions = torch.arange(tokens) if pos is None else pos
            tr = t.double().requires_grad_()
            ref = reference(tr, angles, positions)
            (ref * dy.double()).sum().backward()
            out[f"{name}_{pos_name}_y"] = float((y.double() - ref).abs().max())
            out[f"{name}_{pos_name}_dt"] = float((ta.grad.double() - tr.grad).abs().max())
            out[f"{name}_{pos_name}_changed"] = float((ref - t.double()).abs().max())
    # transformers' form: given cos/sin tables (halves unequal here: the general rotation), the
    # input a transposed view ([heads, tokens, dim] storage read as [tokens, heads, dim]).
    from vime.training.kernels.rope import rotate_with_tables

    tokens, heads, dim = 11, 3, 12
    cos, sin = (torch.randn(tokens, dim, generator=g) for _ in range(2))
    base = torch.randn(heads, tokens, dim, generator=g)
    dy = torch.randn(tokens, heads, dim, generator=g)
    ta = base.clone().requires_grad_()
    y = rotate_with_tables(ta.transpose(0, 1), cos, sin)
    (y * dy).sum().backward()
    tr = base.double().requires_grad_()
    t64 = tr.transpose(0, 1)
    half = dim // 2
    rotated = torch.cat((-t64[..., half:], t64[..., :half]), dim=-1)
    ref = t64 * cos.double()[:, None] + rotated * sin.double()[:, None]
    (ref * dy.double()).sum().backward()
    out["tables_y"] = float((y.double() - ref).abs().max())
    out["tables_dt"] = float((ta.grad.double() - tr.grad).abs().max())
    out["tables_changed"] = float((ref - t64).abs().max())
    return out


def _qk_reference(mixed, per_group, qw, kw, eps, angles, pos):
    """Float64 query, key, value from a QKV projection's output: the per-head RMSNorm of the
    query and key (when weights are given), then RoPE of non-interleaved halves."""
    tokens, groups, _ = mixed.shape
    dim = angles.shape[1]
    x = mixed.double()
    q = x[..., : per_group * dim].reshape(tokens, groups * per_group, dim)
    k = x[..., per_group * dim : (per_group + 1) * dim]
    v = x[..., (per_group + 1) * dim :]
    if qw is not None:
        q, k = _rms_reference(q, qw, eps), _rms_reference(k, kw, eps)
    a = angles.double()[pos][:, None, :]
    c, s = a.cos(), a.sin()
    half = dim // 2

    def rotate(t):
        t1, t2 = t[..., :half], t[..., half:]
        return torch.cat((t1 * c[..., :half] - t2 * s[..., :half],
                          t2 * c[..., half:] + t1 * s[..., half:]), dim=-1)  # fmt: skip

    return rotate(q), rotate(k), v


def qk_norm_rope_cases() -> dict[str, float]:
    """The query/key norm + RoPE kernels against float64 math (fp32 storage), and against the
    unfused kernels' composition (bf16 storage): groups and heads that are not powers of two,
    a padded head width, a group stride wider than the group, with and without norms, packed
    positions, fewer tokens than a whole number of backward programs, and an output that takes
    no gradient, gradients that arrive as transposed views."""
    from vime.training.kernels import qk_norm_rope, rope
    from vime.training.kernels.rms_norm import rms_norm

    g = torch.Generator().manual_seed(3)
    out: dict[str, float] = {}
    launches = {"forward": 0, "backward": 0}
    fwd, bwd = qk_norm_rope._kernels()

    class Counted:
        def __init__(self, kernel, key):
            self.kernel, self.key = kernel, key

        def __getitem__(self, grid):
            launches[self.key] += 1
            return self.kernel[grid]

    qk_norm_rope._kernels = lambda: (Counted(fwd, "forward"), Counted(bwd, "backward"))
    cases = {
        "qwen3": (10, 3, 2, 16, True),  # tokens, groups, query heads per group, dim, norms
        "padded_dim": (7, 2, 3, 12, True),
        "no_norm": (10, 3, 2, 16, False),
    }
    for name, (tokens, groups, per_group, dim, norm) in cases.items():
        width = (per_group + 2) * dim
        storage = torch.randn(tokens, groups, width + 5, generator=g) * 3
        mixed = storage[..., :width]  # a group stride of width + 5
        angles = torch.rand(24, dim, generator=g) * 6
        qw = torch.randn(dim, generator=g) if norm else None
        kw = torch.randn(dim, generator=g) if norm else None
        dq = torch.randn(tokens, groups * per_group, dim, generator=g)
        dk = torch.randn(tokens, groups, dim, generator=g)
        dv = torch.randn(tokens, groups, dim, generator=g)
        for pos_name, pos in (
            ("index", None),
            ("packed", torch.tensor([i % 4 for i in range(tokens)])),
        ):
            leaves = [t.clone().requires_grad_() if t is not None else None
                      for t in (mixed, qw, kw)]  # fmt: skip
            q, k, v = qk_norm_rope.split_norm_rope(leaves[0], per_group, leaves[1], leaves[2],
                                                   1e-6, angles, pos)  # fmt: skip
            # The query's and key's gradients arrive as transposed views, as attention's do.
            dq_t, dk_t = dq.transpose(0, 1).contiguous(), dk.transpose(0, 1).contiguous()
            loss = (q.transpose(0, 1) * dq_t).sum() + (k.transpose(0, 1) * dk_t).sum()
            (loss + (v * dv).sum()).backward()
            ref_leaves = [t.double().requires_grad_() if t is not None else None
                          for t in (mixed, qw, kw)]  # fmt: skip
            positions = torch.arange(tokens) if pos is None else pos
            rq, rk, rv = _qk_reference(ref_leaves[0], per_group, ref_leaves[1], ref_leaves[2],
                                       1e-6, angles, positions)  # fmt: skip
            ((rq * dq).sum() + (rk * dk).sum() + (rv * dv).sum()).backward()
            key = f"{name}_{pos_name}"
            for part, got, want in (("q", q, rq), ("k", k, rk), ("v", v, rv)):
                out[f"{key}_{part}"] = float((got.detach().double() - want).abs().max())
            out[f"{key}_dmixed"] = float((leaves[0].grad.double() - ref_leaves[0].grad).abs().max())
            if norm:
                for i, w in ((1, "dqw"), (2, "dkw")):
                    exact = ref_leaves[i].grad
                    diff = (leaves[i].grad.double() - exact).abs().max()
                    out[f"{key}_{w}_rel"] = float(diff / exact.abs().max())
            out[f"{key}_changed"] = float((rq - ref_leaves[0][..., : per_group * dim]
                                           .reshape(rq.shape)).abs().max())  # fmt: skip
        # The value takes no gradient: its part of the input's gradient is zero.
        leaf = mixed.clone().requires_grad_()
        q, k, _ = qk_norm_rope.split_norm_rope(leaf, per_group, qw, kw, 1e-6, angles, None)
        ((q * dq).sum() + (k * dk).sum()).backward()
        out[f"{name}_no_dv_value_grad"] = float(leaf.grad[..., (per_group + 1) * dim :].abs().max())
    # bf16 storage: the unfused kernels (rms_norm, then rope) in the same dtype.
    tokens, groups, per_group, dim = 9, 2, 2, 16
    mixed = torch.randn(tokens, groups, (per_group + 2) * dim, generator=g).bfloat16()
    angles = torch.rand(16, dim, generator=g) * 6
    qw, kw = torch.randn(dim, generator=g).bfloat16(), torch.randn(dim, generator=g).bfloat16()
    dq = torch.randn(tokens, groups * per_group, dim, generator=g).bfloat16()
    dk = torch.randn(tokens, groups, dim, generator=g).bfloat16()
    leaf = mixed.clone().requires_grad_()
    q, k, _ = qk_norm_rope.split_norm_rope(leaf, per_group, qw, kw, 1e-6, angles, None)
    ((q.float() * dq.float()).sum() + (k.float() * dk.float()).sum()).backward()
    ref = mixed.clone().requires_grad_()
    rq = ref[..., : per_group * dim].reshape(tokens, groups * per_group, dim)
    rk = ref[..., per_group * dim : (per_group + 1) * dim]
    rq = rope.rotate(rms_norm(rq, qw, 1e-6), angles, None)
    rk = rope.rotate(rms_norm(rk, kw, 1e-6), angles, None)
    ((rq.float() * dq.float()).sum() + (rk.float() * dk.float()).sum()).backward()
    for name, got, want in (("q", q, rq), ("k", k, rk), ("dmixed", leaf.grad, ref.grad)):
        scale = want.detach().float().abs().max()
        out[f"bf16_{name}_rel"] = float(
            (got.detach().float() - want.detach().float()).abs().max() / scale
        )
    out.update(launches)
    return out


def swiglu_cases() -> dict[str, float]:
    """SwiGLU and its gradient against float64 math (fp32 and bf16 inputs); widths over one
    block, odd rows, 3-D input."""
    from vime.training.kernels.swiglu import available, swiglu, swiglu_back

    g = torch.Generator().manual_seed(2)
    out: dict[str, float] = {}
    for name, shape in {"rows": (33, 2 * 1100), "narrow": (5, 2, 2 * 40)}.items():
        y = torch.randn(*shape, generator=g) * 3
        grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=g)
        assert available(y)
        y64 = y.double().requires_grad_()
        a, b = y64.chunk(2, -1)
        ref = F.silu(a) * b
        ref.backward(grad.double())
        out[f"{name}_fp32_out"] = float((swiglu(y).double() - ref.detach()).abs().max())
        back = swiglu_back(grad, y)
        out[f"{name}_fp32_grad"] = float((back.double() - y64.grad).abs().max())
        # bf16 storage: one rounding of the exact result (relative error at most 2^-9).
        yb, gb = y.bfloat16(), grad.bfloat16()
        yb64 = yb.double().requires_grad_()
        a, b = yb64.chunk(2, -1)
        refb = F.silu(a) * b
        refb.backward(gb.double())
        out[f"{name}_bf16_out_rel"] = _relative(swiglu(yb), refb.detach())
        out[f"{name}_bf16_grad_rel"] = _relative(swiglu_back(gb, yb), yb64.grad)
    # With autograd, on a fused gate/up projection's output (what the weight copy runs).
    from vime.training.kernels.swiglu import _GatedSilu, gated_silu

    launched = []
    apply = _GatedSilu.apply
    _GatedSilu.apply = lambda y: launched.append(1) or apply(y)  # type: ignore[method-assign]
    y = (torch.randn(4, 9, 2 * 1100, generator=g) * 3).requires_grad_()
    grad = torch.randn(4, 9, 1100, generator=g)
    gated_silu(y).backward(grad)
    y64 = y.detach().double().requires_grad_()
    a, b = y64.chunk(2, -1)
    ref = F.silu(a) * b
    ref.backward(grad.double())
    out["gated_fp32_out"] = float((gated_silu(y.detach()).double() - ref.detach()).abs().max())
    out["gated_fp32_grad"] = float((y.grad.double() - y64.grad).abs().max())
    out["gated_launched"] = float(len(launched) == 2)
    _GatedSilu.apply = apply  # type: ignore[method-assign]
    # Two tensors (transformers' gate and up projections), an odd count of elements.
    from vime.training.kernels.swiglu import silu_mul

    for dtype in (torch.float32, torch.bfloat16):
        a, b = (torch.randn(3, 7, 1500, generator=g).mul(3).to(dtype) for _ in range(2))
        grad = torch.randn(3, 7, 1500, generator=g).to(dtype)
        a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
        y = silu_mul(a_, b_)
        y.backward(grad)
        a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
        ref = F.silu(a64) * b64
        ref.backward(grad.double())
        tag = "pair_fp32" if dtype == torch.float32 else "pair_bf16"
        fn = (
            (lambda x, r: float((x.double() - r).abs().max()))
            if dtype == torch.float32
            else _relative
        )
        out[f"{tag}_out"] = fn(y.detach(), ref.detach())
        out[f"{tag}_grad_a"] = fn(a_.grad, a64.grad)
        out[f"{tag}_grad_b"] = fn(b_.grad, b64.grad)
    return out


def _adamw_reference(p, g, m, v, h) -> tuple:
    """Decoupled weight decay AdamW (Loshchilov & Hutter, Algorithm 2) in float64."""
    g = g.double() * h.grad_scale
    m = h.beta1 * m.double() + (1 - h.beta1) * g
    v = h.beta2 * v.double() + (1 - h.beta2) * g * g
    m_hat = m / (1 - h.beta1**h.step)
    v_hat = v / (1 - h.beta2**h.step)
    p = p.double() * (1 - h.lr * h.weight_decay) - h.lr * m_hat / (v_hat.sqrt() + h.eps)
    return p, m, v


def adamw_cases() -> dict[str, float]:
    """The multi-tensor AdamW kernel over three steps against float64 math and torch's AdamW:
    tensors smaller and larger than a block, odd sizes, a gradient scaled (clipped) by a float
    and by a one-element tensor, weight decay, and the bf16 model copy (one rounding of the
    new fp32 master)."""
    from vime.training.kernels import adamw

    assert adamw.BLOCK == 4096
    gen = torch.Generator().manual_seed(3)
    shapes = [(3,), (4096,), (5000,), (7, 1300)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    start = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    models = [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
    ref = [(p.double(), torch.zeros(p.shape, dtype=torch.float64), torch.zeros(p.shape,
            dtype=torch.float64)) for p in params]  # fmt: skip
    torch_params = [torch.nn.Parameter(p.clone()) for p in params]
    torch_opt = torch.optim.AdamW(torch_params, lr=0.01, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, foreach=False)  # fmt: skip
    launches = _count_calls(adamw, "_launch")
    out: dict[str, float] = {}
    tables: list[torch.Tensor] = []
    for step in (1, 2, 3):
        # New gradient tensors each step, as the torch backend's: the pointers move
        grads = [torch.randn(p.shape, generator=gen) * 10 ** (step - 2) for p in params]
        # Step 2 scales by a float, step 3 by a device tensor the kernel reads (a clip factor
        # computed on the GPU).
        scale = {1: 1.0, 2: 0.5, 3: torch.tensor([0.25])}[step]
        h = adamw.AdamWHyper(lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
                             step=step, grad_scale=scale)  # fmt: skip
        adamw.adamw_step(params, grads, m, v, models, h)
        tables = tables or [p.block_tensor for p in adamw._plans.values()]
        ref = [_adamw_reference(*r[:1], gr, *r[1:], h) for r, gr in zip(ref, grads, strict=True)]
        for tp, gr in zip(torch_params, grads, strict=True):
            tp.grad = gr * h.grad_scale
        torch_opt.step()
        for i, (p, (rp, rm, rv)) in enumerate(zip(params, ref, strict=True)):
            # Relative to the tensor's largest value: the moments span 1e-2 to 1e2 here.
            for name, got, exact in (("p", p, rp), ("m", m[i], rm), ("v", v[i], rv)):
                scale = float(exact.abs().max())
                out[f"s{step}_t{i}_{name}"] = float((got.double() - exact).abs().max()) / scale
            out[f"s{step}_t{i}_torch_p"] = float((p - torch_params[i].detach()).abs().max())
            # bf16 copy: the fp32 master rounded once (the interpreter truncates: one step).
            out[f"s{step}_t{i}_model_bf16_rel"] = _relative(models[i], p.double())
    for i, p in enumerate(params):
        out[f"t{i}_moved"] = float((p - start[i]).abs().max())
    out["aligned"] = float(all(plan.aligned for plan in adamw._plans.values()))
    # one plan, its block tables built once: only the pointer table followed the gradients
    kept = [p.block_tensor for p in adamw._plans.values()]
    out["block_tables_kept"] = float(len(kept) == 1 and kept[0] is tables[0])
    # Views one element into a buffer (4-byte aligned only) take the kernel's scalar path.
    flat = [torch.randn(1 + 6000, generator=gen) for _ in range(4)]
    p, g, m, v = (x[1 : 1 + 5000] for x in flat)
    m.zero_(), v.zero_()
    exact = _adamw_reference(p, g, m, v, h)
    adamw._plans.clear()
    adamw.adamw_step([p], [g], [m], [v], None, h)
    out["unaligned_taken"] = float(not any(plan.aligned for plan in adamw._plans.values()))
    out["unaligned_p"] = float((p.double() - exact[0]).abs().max()) / float(exact[0].abs().max())
    out["launches"] = launches[0]
    return out


def output_softmax_cases() -> dict[str, float]:
    """The chunked output layer with its softmax in the Triton kernels (fused=True) against
    float64 math (fp32 inputs) and against its torch path (fp32 and bf16): values and the
    gradients of hidden states and weights. Vocab sizes under, at and over the kernels' 4,096
    tile, a temperature, row selection, each output alone, and two vocab shards (gloo)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from output_logprobs_data import grads, inputs, reference, vocab_parallel_grads

    from vime.training.kernels import output_softmax
    from vime.training.launch import spawn
    from vime.training.output_logprobs import token_logprobs_and_entropy

    calls = {"stats": _count_calls(output_softmax, "row_stats"),
             "grad": _count_calls(output_softmax, "logits_grad_")}  # fmt: skip
    out: dict[str, float] = {}

    def compare(name, got, want):
        for part, a, b in zip(("lp", "ent", "gh", "gw"), got, want, strict=True):
            scale = float(b.abs().max().clamp_min(1e-30))
            out[f"{name}_{part}"] = float((a.double() - b.double()).abs().max()) / scale

    for v in (53, 4096, 5000):
        for temperature in (1.0, 0.7):
            data = inputs(n=37, h=16, v=v, seed=v)
            f64 = inputs(n=37, h=16, v=v, seed=v, dtype=torch.float64)

            def fused(h, w, t, temperature=temperature, on=True):
                return token_logprobs_and_entropy(
                    h, w, t, temperature=temperature, chunk_tokens=8, fused=on
                )

            got = grads(fused, *data)
            compare(f"v{v}_t{temperature}_f64", got, grads(
                lambda h, w, t, temperature=temperature: reference(h, w, t, temperature),
                *f64))  # fmt: skip
            compare(f"v{v}_t{temperature}_torch", got, grads(
                lambda h, w, t: fused(h, w, t, on=False), *data))  # fmt: skip
    data = inputs(n=37, h=16, v=5000, seed=1)
    f64 = inputs(n=37, h=16, v=5000, seed=1, dtype=torch.float64)
    got = grads(lambda h, w, t: token_logprobs_and_entropy(h, w, t, chunk_tokens=5), *data, False)
    compare("no_entropy", got, grads(reference, *f64, use_entropy=False))
    hidden, weight, targets, _, coef = data
    _, ent = token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=4)
    g = torch.autograd.grad((ent * coef).sum(), hidden)[0]
    _, ref_ent = reference(*f64[:3])
    want = torch.autograd.grad((ref_ent * f64[4]).sum(), f64[0])[0]
    out["entropy_alone_gh"] = float((g.double() - want).abs().max() / want.abs().max())
    rows = torch.tensor([0, 3, 4, 5, 19, 36])
    lp, ent = token_logprobs_and_entropy(hidden, weight, targets, chunk_tokens=4, rows=rows)
    ref_lp, ref_ent = reference(*f64[:3])
    keep = torch.zeros(37, dtype=torch.bool).index_fill_(0, rows, True)
    out["rows_zero_elsewhere"] = float((lp[~keep] != 0).sum() + (ent[~keep] != 0).sum())
    out["rows_lp"] = float((lp.double() - ref_lp.where(keep, 0.0)).abs().max())
    # bf16 inputs: the kernels and the torch path both read the same bf16 logits.
    h, w, t, c_lp, c_ent = inputs(n=64, h=32, v=5000, seed=3, dtype=torch.bfloat16)
    got = grads(lambda *x: token_logprobs_and_entropy(*x, chunk_tokens=16), h, w, t, c_lp, c_ent)
    torch_path = grads(lambda *x: token_logprobs_and_entropy(*x, chunk_tokens=16, fused=False),
                       h, w, t, c_lp, c_ent)  # fmt: skip
    compare("bf16_torch", got, torch_path)
    kernel_calls = {k: count[0] for k, count in calls.items()}
    # Two vocab shards: each rank's kernels (fp32 on the interpreter), combined across the group.
    assert output_softmax.available(torch.zeros(1, 1))
    shards = spawn(vocab_parallel_grads, 2, 54, 10, torch.float32, timeout=300)
    f64 = inputs(v=54, seed=4, dtype=torch.float64)
    lp64, ent64, gh64, gw64 = grads(reference, *f64)
    for rank, (lp, ent, gh, gw) in enumerate(shards):
        want = (lp64, ent64, gh64, gw64[rank * 27 : (rank + 1) * 27])
        compare(f"tp_rank{rank}", (lp, ent, gh, gw), want)
    out["stats_calls"], out["grad_calls"] = kernel_calls["stats"], kernel_calls["grad"]
    return out


def output_softmax_flag_cases(model: str, tmp: str) -> dict[str, float]:
    """``vime train`` flags -> setup -> torch trainer: one train step with and without
    --no-output-softmax-fusion, counting the kernels' forward calls; same loss either way."""
    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup
    from vime.training.batch import TrainBatch, TrainSample
    from vime.training.kernels import output_softmax
    from vime.training.torch_backend import TorchTrainer

    calls = _count_calls(output_softmax, "row_stats")
    out: dict[str, float] = {}
    mask = [0, 0] + [1] * 6
    sample = TrainSample(token_ids=[3, 17, 22, 9, 41, 5, 8, 30], loss_mask=mask,
                         advantages=[float(m) for m in mask],
                         rollout_logprobs=[-2.0 * m for m in mask])  # fmt: skip
    for name, extra in (("on", []), ("off", ["--no-output-softmax-fusion"])):
        argv = ["train", "--model", model, "--env", "vime/Math-v0", "--output-dir", tmp, *extra]
        setup = build_setup(parse_args(argv))
        out[f"{name}_config"] = float(setup.trainer.output_softmax_fusion)
        calls[0] = 0
        metrics = TorchTrainer(setup.trainer, setup.loss).train_step(TrainBatch([sample]))
        out[f"{name}_calls"], out[f"{name}_loss"] = calls[0], metrics["loss"]
    return out


def two_sample_batch() -> TrainBatch:  # noqa: F821 - imported inside
    """Two short samples (10 and 6 tokens), prompts masked, advantages of both signs."""
    from vime.training.batch import TrainBatch, TrainSample

    mask = [0, 0, 0] + [1] * 7
    return TrainBatch([
        TrainSample(token_ids=[3, 17, 22, 9, 41, 5, 8, 30, 11, 2], loss_mask=mask,
                    advantages=[0.5 * m for m in mask], rollout_logprobs=[-2.0 * m for m in mask]),
        TrainSample(token_ids=[7, 1, 60, 14, 23, 4], loss_mask=[0, 0, 1, 1, 1, 1],
                    advantages=[0, 0, -1.0, -1.0, -1.0, -1.0], rollout_logprobs=[0, 0, -1, -1, -1, -1]),
    ])  # fmt: skip


def hf_module_cases(tmp: str) -> dict[str, float]:
    """The torch trainer on tiny Llama, Qwen2 and Qwen3 models (fp32) with each of
    --hf-rms-norm-fusion, --hf-swiglu-fusion and --hf-rope-fusion alone, against all off: logprobs, one train
    step's loss, grad norm and every parameter's gradient; and how many calls took the
    kernels (a forward call each)."""
    from vime.models.tiny import build_tiny_model
    from vime.training.base import TrainerConfig
    from vime.training.kernels import rms_norm, rope, swiglu
    from vime.training.torch_backend import TorchTrainer

    calls = {"rms_norm": 0, "swiglu": 0, "rope": 0}
    norm_apply, mlp_apply = rms_norm._RMSNorm.apply, swiglu._SiluMul.apply
    rope_apply = rope._RopeTables.apply

    def counted(key, fn):
        def call(*a):
            calls[key] += 1
            return fn(*a)

        return call

    rms_norm._RMSNorm.apply = counted("rms_norm", norm_apply)
    swiglu._SiluMul.apply = counted("swiglu", mlp_apply)
    rope._RopeTables.apply = counted("rope", rope_apply)
    batch = two_sample_batch()
    out: dict[str, float] = {}
    for family in ("llama", "qwen2", "qwen3"):
        folder = build_tiny_model(os.path.join(tmp, family), family=family, seed=1)
        runs = {}
        for name, norm, mlp, rot in (
            ("off", False, False, False),
            ("norm", True, False, False),
            ("mlp", False, True, False),
            ("rope", False, False, True),
        ):
            config = TrainerConfig(hf_checkpoint=str(folder), lr=1e-2, seed=3, dtype="float32",
                                   hf_rms_norm_fusion=norm, hf_swiglu_fusion=mlp,
                                   hf_rope_fusion=rot)  # fmt: skip
            calls.update(rms_norm=0, swiglu=0, rope=0)
            trainer = TorchTrainer(config)
            before = trainer.compute_logprobs(batch)
            grads: dict[str, torch.Tensor] = {}
            step = trainer._optimizer_step

            def snapshot(trainer=trainer, grads=grads, step=step):
                named = trainer.model.named_parameters()
                grads.update({n: p.grad.clone() for n, p in named if p.grad is not None})
                return step()

            trainer._optimizer_step = snapshot
            metrics = trainer.train_step(batch)
            runs[name] = (before, metrics, grads, dict(calls))
        lp0, m0, g0, c0 = runs["off"]
        out[f"{family}_off_calls"] = sum(c0.values())
        for name, kernel in (("norm", "rms_norm"), ("mlp", "swiglu"), ("rope", "rope")):
            lp, m, g, c = runs[name]
            key = f"{family}_{name}"
            out[f"{key}_calls"] = c[kernel]
            out[f"{key}_other_calls"] = sum(c.values()) - c[kernel]
            out[f"{key}_logprobs"] = max(
                float((a - b).abs().max()) for a, b in zip(lp, lp0, strict=True)
            )
            out[f"{key}_loss"] = abs(m["loss"] - m0["loss"])
            out[f"{key}_grad_norm_rel"] = abs(m["grad_norm"] - m0["grad_norm"]) / m0["grad_norm"]
            out[f"{key}_grads_rel"] = max(
                float((g[k] - g0[k]).abs().max() / g0[k].abs().max()) for k in g0
            )
    return out


def _stacked_mlp(mlp, x):
    from vime.training.kernels.swiglu import gated_silu

    both = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    return mlp.down_proj(gated_silu(F.linear(x, both)))


def weight_copy_kernel_cases(tmp: str) -> dict[str, float]:
    """--bf16-weight-copy with the hf kernels (as on CUDA) on tiny Qwen3: a train step on the
    copy against a bf16 replica of the model with the same kernels and float32 accumulation
    of its gradients. Returns the largest differences and the kernels' forward calls."""
    import contextlib

    from vime.models.tiny import build_tiny_model
    from vime.training.base import TrainerConfig
    from vime.training.kernels import rms_norm, rope, swiglu
    from vime.training.torch_backend import TorchTrainer

    calls = [0]
    for cls in (rms_norm._RMSNorm, swiglu._SiluMul, swiglu._GatedSilu, rope._RopeTables):

        def counted(*a, fn=cls.apply):
            calls[0] += 1
            return fn(*a)

        cls.apply = counted
    batch = two_sample_batch()
    folder = build_tiny_model(os.path.join(tmp, "qwen3"), family="qwen3", seed=1)
    runs = {}
    for name in ("copy", "replica"):
        config = TrainerConfig(hf_checkpoint=str(folder), lr=1e-2, seed=3, dtype="bfloat16",
                               bf16_weight_copy=name == "copy", max_tokens_per_micro_batch=10)  # fmt: skip
        trainer = TorchTrainer(config)
        grads: dict[str, torch.Tensor] = {}
        if name == "replica":
            trainer._autocast = contextlib.nullcontext
            with torch.no_grad():
                for param in trainer.model.parameters():
                    param.data = param.data.to(torch.bfloat16)
            for module in trainer.model.modules():
                if type(module).__name__ == "Qwen3MLP":  # the copy stacks gate and up
                    module.forward = types.MethodType(_stacked_mlp, module)
            for n, param in trainer.model.named_parameters():

                def add(p, n=n, grads=grads):
                    g = p.grad.float()
                    grads[n] = g if n not in grads else grads[n] + g
                    p.grad = None

                param.register_post_accumulate_grad_hook(add)

        def snapshot(trainer=trainer, grads=grads):
            named = trainer.model.named_parameters()
            grads.update({n: p.grad.clone() for n, p in named if p.grad is not None})
            trainer.optimizer.zero_grad(set_to_none=True)
            return 0.0

        trainer._optimizer_step = snapshot
        calls[0] = 0
        metrics = trainer.train_step(batch)
        runs[name] = (metrics, grads, calls[0])
    (m, g, c), (m0, g0, c0) = runs["copy"], runs["replica"]
    return {
        "calls": c,
        "replica_calls": c0,
        "micro_batches": m["num_micro_batches"],
        "loss": abs(m["loss"] - m0["loss"]),
        "same_names": float(sorted(g) == sorted(g0) and len(g) > 0),
        "grads": max(float((g[k] - g0[k]).abs().max()) for k in g0),
        "grad_dtypes_fp32": float(all(t.dtype == torch.float32 for t in g.values())),
    }


def torch_optimizer_fusion_cases(tmp: str) -> dict[str, float]:
    """``vime train`` flags -> setup -> torch trainer on tiny Qwen3 with clipping and weight
    decay active, with --hf-optimizer-fusion (the default) and with --no-hf-optimizer-fusion
    (torch's clip_grad_norm_ and AdamW): the largest differences of each step's loss and
    gradient norm, the float32 weights and torch's AdamW states after the steps, and how often
    the kernel launched. In float32, three steps; on the bf16 weight copy one step, and how
    the copy the kernel wrote matches its new masters. (The interpreter rounds float32 to
    bf16 toward zero where CUDA rounds to nearest even, so copies it writes differ from
    torch's by an ulp and the runs part after one step.)"""
    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup
    from vime.models.tiny import build_tiny_model
    from vime.training.kernels import adamw
    from vime.training.torch_backend import TorchTrainer

    launches = _count_calls(adamw, "_launch")
    folder = build_tiny_model(os.path.join(tmp, "qwen3"), family="qwen3", seed=1)
    batch = two_sample_batch()
    out: dict[str, float] = {}
    for kind, steps in (("copy", 1), ("float32", 3)):
        runs = {}
        for fused in (True, False):
            argv = ["train", "--model", str(folder), "--env", "vime/Math-v0", "--output-dir", tmp,
                    "--lr", "1e-2", "--weight-decay", "0.1", "--clip-grad", "0.05",
                    "--max-tokens-per-micro-batch", "10"]  # fmt: skip
            argv += ["--dtype", "bfloat16", "--bf16-weight-copy"] if kind == "copy" else []
            argv += [] if fused else ["--no-hf-optimizer-fusion"]
            setup = build_setup(parse_args(argv))
            trainer = TorchTrainer(setup.trainer, setup.loss)
            launches[0] = 0
            metrics = [trainer.train_step(batch) for _ in range(steps)]
            runs[fused] = (trainer, metrics, launches[0])
        (t, m, n), (t0, m0, n0) = runs[True], runs[False]
        out[f"{kind}_launches"], out[f"{kind}_unfused_launches"] = n, n0
        out[f"{kind}_loss"] = max(abs(a["loss"] - b["loss"]) for a, b in zip(m, m0, strict=True))
        out[f"{kind}_grad_norm_rel"] = max(abs(a["grad_norm"] / b["grad_norm"] - 1)
                                           for a, b in zip(m, m0, strict=True))  # fmt: skip
        out[f"{kind}_min_grad_norm"] = min(b["grad_norm"] for b in m0)  # clipping was active
        weights = dict(t.model.named_parameters())
        out[f"{kind}_weights"] = max(float((weights[k] - w).abs().max())
                                     for k, w in t0.model.named_parameters())  # fmt: skip
        out[f"{kind}_moved"] = min(float((w - w0).abs().max()) for w, w0 in
                                   zip(t.model.parameters(), _initial_weights(folder), strict=True))  # fmt: skip
        states, states0 = t.optimizer.state_dict()["state"], t0.optimizer.state_dict()["state"]
        out[f"{kind}_same_states"] = float(
            sorted(states) == sorted(states0)
            and all(sorted(states[i]) == sorted(states0[i]) for i in states0)
            and all(states[i][k].dtype == states0[i][k].dtype for i in states0 for k in states0[i])
            and all(
                states[i][k].device == states0[i][k].device for i in states0 for k in states0[i]
            )
        )
        out[f"{kind}_steps"] = max(abs(float(states[i]["step"]) - steps) for i in states)
        for key in ("exp_avg", "exp_avg_sq"):  # relative to each tensor's largest entry
            out[f"{kind}_{key}"] = max(
                float((states[i][key] - states0[i][key]).abs().max() / states0[i][key].abs().max())
                for i in states0
            )
        if kind == "copy":  # each copy holds its master's new value rounded as the interpreter
            copy = t.weight_copy  # rounds (toward zero): no refresh needed
            out["copy_stale"], out["unfused_copy_stale"] = (
                float(copy._stale),
                float(t0.weight_copy._stale),
            )
            out["copy_vs_masters"] = max(
                float((copy.copy_of[id(p)].float() - _toward_zero_bf16(p.detach())).abs().max())
                for p in t.model.parameters()
            )
    return out


def _initial_weights(folder) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).parameters())


def _toward_zero_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to bf16 toward zero (the low 16 bits cleared), as a float32."""
    return (x.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


def _count_calls(owner: object, name: str) -> list[int]:
    """Replace ``owner.name`` with a wrapper that counts its calls into the returned list's
    one element (the process ends after the check, so nothing is restored)."""
    fn, count = getattr(owner, name), [0]

    def counted(*args):
        count[0] += 1
        return fn(*args)

    setattr(owner, name, counted)
    return count


def _relative(value: torch.Tensor, exact: torch.Tensor) -> float:
    return float(((value.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max())


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
