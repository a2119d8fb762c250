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

The gated MLPs given as ``fuse_gate_up`` get their gate and up projections' copies as the two
halves of one ``[2 * intermediate, hidden]`` tensor, set on the module as ``_vime_gate_up``
while the copy is active: the MLP then runs one matmul where transformers runs two, and one
for each of backward's two products where it runs four and a sum (see
:mod:`vime.training.hf_kernels`). That tensor's gradient is split back into the two masters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightCopy:
    """A ``dtype`` copy of every floating-point parameter of ``model``, one per distinct
    tensor (tied weights share theirs); :meth:`active` swaps them in."""

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype,
        fuse_gate_up: Sequence[torch.nn.Module] = (),
    ) -> None:
        import torch

        self._slots: list[tuple[Any, str, torch.nn.Parameter, torch.nn.Parameter]] = []
        copies: dict[int, torch.nn.Parameter] = {}
        self._gate_up = [(mlp, _fused_pair(mlp, dtype, copies)) for mlp in fuse_gate_up]
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
        self.copy_of = {id(m): c.detach() for m, c in seen.values()}
        """Each master's copy by the master's ``id``: an optimizer step that writes these with
        the new weights, rounded, leaves the copy fresh (no :meth:`mark_stale`)."""
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
            for mlp, fused in self._gate_up:
                mlp._vime_gate_up = fused
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for module, name, master, _ in self._slots:
                    module._parameters[name] = master
                for mlp, _ in self._gate_up:
                    del mlp._vime_gate_up


def _fused_pair(
    mlp: torch.nn.Module, dtype: torch.dtype, copies: dict[int, torch.nn.Parameter]
) -> torch.nn.Parameter:
    """One ``dtype`` tensor holding the copies of ``mlp``'s gate and up weights, which are
    entered in ``copies`` as views of its halves (refreshing them fills it)."""
    import torch

    masters = [mlp.gate_proj.weight, mlp.up_proj.weight]
    gate, up = masters
    if gate.shape != up.shape or gate.requires_grad != up.requires_grad or id(gate) in copies:
        raise ValueError(f"fuse_gate_up: {type(mlp).__name__}'s gate and up weights cannot be "
                         f"fused ({tuple(gate.shape)} and {tuple(up.shape)})")  # fmt: skip
    fused = torch.nn.Parameter(
        torch.empty((2 * gate.shape[0], gate.shape[1]), dtype=dtype, device=gate.device),
        requires_grad=gate.requires_grad,
    )
    for master, half in zip(masters, fused.detach().chunk(2), strict=True):
        # A parameter over the half's memory, for any code that calls the projection itself.
        view = torch.nn.Parameter(half, requires_grad=master.requires_grad)
        if master.requires_grad:
            view.register_post_accumulate_grad_hook(_add_into(master))
        copies[id(master)] = view
    if gate.requires_grad:
        fused.register_post_accumulate_grad_hook(_add_halves_into(masters))
    return fused


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


def _add_halves_into(masters: list[torch.nn.Parameter]) -> Any:
    """The hook that moves a fused copy's finished gradient into its masters' ``.grad``."""
    import torch

    def hook(fused: torch.Tensor) -> None:
        for master, part in zip(masters, fused.grad.chunk(len(masters)), strict=True):
            if master.grad is None:
                master.grad = part.to(torch.float32)
            else:
                master.grad.add_(part)
        fused.grad = None

    return hook
