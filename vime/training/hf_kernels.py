"""The torch backend's transformers modules through vime's Triton kernels (the kernels run
wherever Triton runs, CUDA; the modules' own forward elsewhere).

``--hf-rms-norm-fusion`` (on): transformers' RMSNorm is four elementwise ops in float32 (``pow``, ``mean``, ``rsqrt``, two
``mul``), each a pass over memory forward and more backward; with Qwen3's query/key norms that
is four norms per layer. :func:`install` points the ``forward`` of each RMSNorm module of a
known family at :func:`vime.training.kernels.rms_norm.rms_norm`: the same function (fp32 math,
one rounding to the input's dtype), one kernel each way. Modules of other classes are left
alone: only classes whose forward is exactly ``weight * x / sqrt(mean(x^2) + eps)`` are listed.

``--hf-rope-fusion`` (on): ``apply_rotary_pos_emb`` of those families' modeling modules, five
elementwise kernels and two temporaries per query and per key (``rotate_half`` slices and
concatenates), is one table-driven kernel each way per tensor
(:func:`vime.training.kernels.rope.rotate_with_tables`). transformers' attention calls its
module's function by name, so the switch is process-wide: :func:`install` sets it for every
model of the process (one trainer per process in Vime).

``--hf-swiglu-fusion`` (on): the gated MLP's ``act_fn(gate_proj(x)) * up_proj(x)`` with a SiLU
activation is a SiLU kernel and a multiply forward, three more backward, and keeps the SiLU's
output for backward; :func:`vime.training.kernels.swiglu.silu_mul` is one kernel each way and
keeps only the two projections. With the bf16 weight copy (:mod:`vime.training.weight_copy`)
the gate and up projections of those MLPs are one matmul on a fused copy of their weights
(:func:`gate_up_modules`), whose output goes to :func:`vime.training.kernels.swiglu.gated_silu`:
backward then takes two matmuls where the two projections take four and a sum.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vime.training.kernels import rope as _rope
from vime.training.kernels.rms_norm import available
from vime.training.kernels.rms_norm import rms_norm as _rms_norm
from vime.training.kernels.swiglu import gated_silu, silu_mul
from vime.training.weight_copy import linear_into_masters

# transformers classes computing weight * x * rsqrt(mean(x^2) + variance_epsilon); Gemma's
# (1 + weight) and others are not here on purpose.
RMS_NORM_CLASSES = frozenset(
    {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"}
)


# transformers' gated MLPs: down_proj(act_fn(gate_proj(x)) * up_proj(x)).
MLP_CLASSES = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "Qwen3MoeMLP", "MistralMLP"})


# Modeling modules whose apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) is
# q * cos + rotate_half(q) * sin (and the same for k).
ROPE_MODULES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral")
_rope_on = False


def install(
    model: torch.nn.Module, rms_norm: bool = True, swiglu: bool = True, rope: bool = True
) -> dict[str, int]:
    """Route ``model``'s RMSNorm modules of :data:`RMS_NORM_CLASSES` (``rms_norm``) and its
    SiLU-gated MLPs of :data:`MLP_CLASSES` (``swiglu``) through the Triton kernels, and set the
    process-wide RoPE switch (``rope``). Returns how many modules of each were routed."""
    global _rope_on
    _rope_on = rope
    if rope:
        _wrap_rope_functions()
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


def gate_up_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MLPs routed by :func:`install` whose gate and up projections are bias-free
    ``nn.Linear`` of one shape (not LoRA-wrapped): those a weight copy can fuse."""
    found = []
    for module in model.modules():
        if (
            getattr(module, "_vime_forward", None) is None
            or type(module).__name__ not in MLP_CLASSES
        ):
            continue
        pair = [getattr(module, "gate_proj", None), getattr(module, "up_proj", None)]
        if all(type(p) is torch.nn.Linear and p.bias is None for p in pair) and (
            pair[0].weight.shape == pair[1].weight.shape
        ):
            found.append(module)
    return found


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
    gate_up = getattr(self, "_vime_gate_up", None)  # set while a weight copy is active
    if gate_up is not None:
        masters = getattr(self, "_vime_gate_up_masters", None)  # wgrad straight into them
        if masters is None:
            return self.down_proj(gated_silu(torch.nn.functional.linear(x, gate_up)))
        return self.down_proj(gated_silu(linear_into_masters(x, gate_up, None, masters)))
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _wrap_rope_functions() -> None:
    import importlib

    for name in ROPE_MODULES:
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        original = getattr(module, "apply_rotary_pos_emb", None)
        if original is not None and not hasattr(original, "vime_original"):
            module.apply_rotary_pos_emb = _fused_rope(original)


def _fused_rope(original: Any) -> Any:
    def apply_rotary_pos_emb(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[0] if args else 1)
        if _rope_on and unsqueeze_dim == 1 and len(args) + len(kwargs) <= 1 and _fits(q, k, cos):
            return _rotate_bhsd(q, cos, sin), _rotate_bhsd(k, cos, sin)
        return original(q, k, cos, sin, *args, **kwargs)

    apply_rotary_pos_emb.vime_original = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _fits(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
    """[B, heads, S, D] query and key with [1 or B, S, D] tables over the whole head."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or not _rope.available(q):
        return False
    b, _, s, d = q.shape
    return (
        k.shape[0] == b and k.shape[2:] == (s, d) and cos.shape[1:] == (s, d)
        and cos.shape[0] in (1, b) and d % 2 == 0
    )  # fmt: skip


def _rotate_bhsd(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, heads, s, d = t.shape
    tokens = t.transpose(1, 2)  # [B, S, heads, D]; a view of the projection's output
    if b > 1 and tokens.stride(0) != s * tokens.stride(1):
        tokens = tokens.contiguous()
    tokens = tokens.reshape(b * s, heads, d)
    tables = [x.expand(b, s, d).reshape(b * s, d) for x in (cos, sin)]
    out = _rope.rotate_with_tables(tokens, *tables)
    return out.view(b, s, heads, d).transpose(1, 2)
