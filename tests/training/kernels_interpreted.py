"""Checks of the Triton kernels (vime.training.kernels) run by test_kernels.py in a child process
with TRITON_INTERPRET=1, so the kernels execute on the CPU. Each check returns the max abs
differences from a float64 reference of the unfused math, by case."""

from __future__ import annotations

import json
import os
import sys

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
    tensors smaller and larger than a block, odd sizes, a scaled (clipped) gradient, weight
    decay, and the bf16 model copy (one rounding of the new fp32 master)."""
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
    launches = 0
    real_launch = adamw._launch

    def counting(*args):
        nonlocal launches
        launches += 1
        real_launch(*args)

    adamw._launch = counting
    out: dict[str, float] = {}
    for step in (1, 2, 3):
        grads = [torch.randn(p.shape, generator=gen) * 10 ** (step - 2) for p in params]
        h = adamw.AdamWHyper(lr=0.01, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8,
                             step=step, grad_scale=0.5 if step == 2 else 1.0)  # fmt: skip
        adamw.adamw_step(params, grads, m, v, models, h)
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
    # Views one element into a buffer (4-byte aligned only) take the kernel's scalar path.
    flat = [torch.randn(1 + 6000, generator=gen) for _ in range(4)]
    p, g, m, v = (x[1 : 1 + 5000] for x in flat)
    m.zero_(), v.zero_()
    exact = _adamw_reference(p, g, m, v, h)
    adamw._plans.clear()
    adamw.adamw_step([p], [g], [m], [v], None, h)
    out["unaligned_taken"] = float(not any(plan.aligned for plan in adamw._plans.values()))
    out["unaligned_p"] = float((p.double() - exact[0]).abs().max()) / float(exact[0].abs().max())
    out["launches"] = launches
    return out


def _relative(value: torch.Tensor, exact: torch.Tensor) -> float:
    return float(((value.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max())


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(globals()[sys.argv[1]]()))
