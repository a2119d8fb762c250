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


def _relative(value: torch.Tensor, exact: torch.Tensor) -> float:
    return float(((value.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max())


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(globals()[sys.argv[1]]()))
