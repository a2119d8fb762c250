"""A low-precision copy of a model's float32 weights for forward and backward.

With ``--bf16-weight-copy`` (the default for bf16 on one GPU) the torch backend's parameters
stay float32 (the optimizer's master weights: checkpoints, export and the optimizer see only
them), and each train step runs on a
bfloat16 copy swapped into the modules: the copy is refreshed once after each optimizer step,
not cast again by autocast for every micro-batch, and the whole model computes in bfloat16 as
the inference engine does, residual stream included (under autocast that stream stays float32
and every matmul casts its input). Each copy's gradient is added into its master's float32
``.grad`` as soon as backward has finished it (a post-accumulate hook), then freed, so
accumulation over micro-batches is in float32, and a step holds at most one layer's bf16
gradients beyond the float32 ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightCopy:
    """A ``dtype`` copy of every floating-point parameter of ``model``, one per distinct
    tensor (tied weights share theirs); :meth:`active` swaps them in."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        import torch

        self._slots: list[tuple[Any, str, torch.nn.Parameter, torch.nn.Parameter]] = []
        copies: dict[int, torch.nn.Parameter] = {}
        for module in model.modules():
            for name, master in module._parameters.items():
                if master is None or not master.is_floating_point():
                    continue
                copy = copies.get(id(master))
                if copy is None:
                    copy = torch.nn.Parameter(
                        torch.empty_like(master, dtype=dtype), requires_grad=master.requires_grad
                    )
                    if master.requires_grad:
                        copy.register_post_accumulate_grad_hook(_add_into(master))
                    copies[id(master)] = copy
                self._slots.append((module, name, master, copy))
        seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for _, _, master, copy in self._slots:
            seen.setdefault(id(master), (master, copy))
        self._masters = [m for m, _ in seen.values()]
        self._copies = [c for _, c in seen.values()]
        self._stale = True
        self._depth = 0

    def mark_stale(self) -> None:
        """The master weights changed (an optimizer step, a checkpoint load): refresh the copy
        before its next use."""
        self._stale = True

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The modules hold the copy inside, their float32 masters again outside (nested
        calls are fine). Backward must run inside too when activations are recomputed."""
        import torch

        if self._stale:
            with torch.no_grad():
                torch._foreach_copy_(self._copies, self._masters)
            self._stale = False
        self._depth += 1
        if self._depth == 1:
            for module, name, _, copy in self._slots:
                module._parameters[name] = copy
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for module, name, master, _ in self._slots:
                    module._parameters[name] = master


def _add_into(master: torch.nn.Parameter) -> Any:
    """The hook that moves a copy's finished gradient into its master's float32 ``.grad``."""
    import torch

    def hook(copy: torch.Tensor) -> None:
        if master.grad is None:
            master.grad = copy.grad.to(torch.float32)
        else:
            master.grad.add_(copy.grad)
        copy.grad = None

    return hook
