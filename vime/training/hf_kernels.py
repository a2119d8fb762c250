"""The torch backend's transformers modules through vime's Triton kernels (the kernels run
wherever Triton runs, CUDA; the modules' own forward elsewhere).

``--hf-rms-norm-fusion`` (on): transformers' RMSNorm is four elementwise ops in float32 (``pow``, ``mean``, ``rsqrt``, two
``mul``), each a pass over memory forward and more backward; with Qwen3's query/key norms that
is four norms per layer. :func:`install` points the ``forward`` of each RMSNorm module of a
known family at :func:`vime.training.kernels.rms_norm.rms_norm`: the same function (fp32 math,
one rounding to the input's dtype), one kernel each way. Modules of other classes are left
alone: only classes whose forward is exactly ``weight * x / sqrt(mean(x^2) + eps)`` are listed.

``--hf-swiglu-fusion`` (on): the gated MLP's ``act_fn(gate_proj(x)) * up_proj(x)`` with a SiLU
activation is a SiLU kernel and a multiply forward, three more backward, and keeps the SiLU's
output for backward; :func:`vime.training.kernels.swiglu.silu_mul` is one kernel each way and
keeps only the two projections.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vime.training.kernels.rms_norm import available
from vime.training.kernels.rms_norm import rms_norm as _rms_norm
from vime.training.kernels.swiglu import silu_mul

# transformers classes computing weight * x * rsqrt(mean(x^2) + variance_epsilon); Gemma's
# (1 + weight) and others are not here on purpose.
RMS_NORM_CLASSES = frozenset(
    {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"}
)


# transformers' gated MLPs: down_proj(act_fn(gate_proj(x)) * up_proj(x)).
MLP_CLASSES = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "Qwen3MoeMLP", "MistralMLP"})


def install(model: torch.nn.Module, rms_norm: bool = True, swiglu: bool = True) -> dict[str, int]:
    """Route ``model``'s RMSNorm modules of :data:`RMS_NORM_CLASSES` (``rms_norm``) and its
    SiLU-gated MLPs of :data:`MLP_CLASSES` (``swiglu``) through the Triton kernels. Returns how
    many modules of each were routed."""
    counts = {"rms_norm": 0, "swiglu": 0}
    for module in model.modules():
        name = type(module).__name__
        if hasattr(module, "_vime_forward"):
            continue
        if rms_norm and name in RMS_NORM_CLASSES:
            _route(module, _fused_norm)
            counts["rms_norm"] += 1
        elif swiglu and name in MLP_CLASSES and _is_silu(getattr(module, "act_fn", None)):
            _route(module, _fused_mlp)
            counts["swiglu"] += 1
    return counts


def _is_silu(act: Any) -> bool:
    # transformers' ACT2FN["silu"] is its own SiLUActivation (F.silu), not nn.SiLU.
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _route(module: torch.nn.Module, forward: Any) -> None:
    module._vime_forward = module.forward
    module.forward = types.MethodType(forward, module)


def _fused_norm(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if not available(hidden_states):
        return self._vime_forward(hidden_states)
    return _rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _fused_mlp(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))
