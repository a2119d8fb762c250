"""The torch backend's transformers modules through vime's Triton kernels
(``--hf-rms-norm-fusion``, on; the kernels run wherever Triton runs, CUDA).

transformers' RMSNorm is four elementwise ops in float32 (``pow``, ``mean``, ``rsqrt``, two
``mul``), each a pass over memory forward and more backward; with Qwen3's query/key norms that
is four norms per layer. :func:`install` points the ``forward`` of each RMSNorm module of a
known family at :func:`vime.training.kernels.rms_norm.rms_norm`: the same function (fp32 math,
one rounding to the input's dtype), one kernel each way. Modules of other classes are left
alone: only classes whose forward is exactly ``weight * x / sqrt(mean(x^2) + eps)`` are listed.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from vime.training.kernels.rms_norm import available, rms_norm

# transformers classes computing weight * x * rsqrt(mean(x^2) + variance_epsilon); Gemma's
# (1 + weight) and others are not here on purpose.
RMS_NORM_CLASSES = frozenset(
    {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"}
)


def install(model: torch.nn.Module) -> int:
    """Route every RMSNorm module of ``model`` of a class in :data:`RMS_NORM_CLASSES` through
    the Triton kernels (where they run; the module's own forward elsewhere). Returns how many
    modules were routed."""
    count = 0
    for module in model.modules():
        if type(module).__name__ in RMS_NORM_CLASSES and not hasattr(module, "_vime_forward"):
            module._vime_forward = module.forward
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count


def _fused_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if not available(hidden_states):
        return self._vime_forward(hidden_states)
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)
