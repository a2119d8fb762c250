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

The linears given as ``accumulate_linears`` (and the fused gate/up projections of their MLPs)
skip the bf16 weight gradient altogether: their backward's weight-gradient GEMM adds straight
into the master's float32 ``.grad`` (:mod:`vime.training.gemm`, as the Megatron backend's
``--gradient-accumulation-fusion``; the first micro-batch's GEMM writes it), where autograd's
GEMM wrote a bf16 gradient that the hook then read, cast and added: 12 bytes of traffic a
weight over two micro-batches instead of 20, and on CUDA the gradient is not rounded to bf16
before it is summed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from vime.training.gemm import wgrad_gemm_accum_fp32, wgrad_gemm_fp32


class WeightCopy:
    """A ``dtype`` copy of every floating-point parameter of ``model``, one per distinct
    tensor (tied weights share theirs); :meth:`active` swaps them in."""

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype,
        fuse_gate_up: Sequence[torch.nn.Module] = (),
        accumulate_linears: Sequence[torch.nn.Module] = (),
    ) -> None:
        self._slots: list[tuple[Any, str, torch.nn.Parameter, torch.nn.Parameter]] = []
        copies: dict[int, torch.nn.Parameter] = {}
        self._gate_up = [(mlp, _fused_pair(mlp, dtype, copies)) for mlp in fuse_gate_up]
        # Linears whose weight gradient goes straight into the master's .grad: each gets an
        # instance forward while the copy is active (the class's own outside).
        accumulate = {id(m) for m in accumulate_linears}
        self._forwards = [
            (m, _accumulating_forward(m, m.weight))
            for m in accumulate_linears
            if type(m) is torch.nn.Linear and m.weight.requires_grad and "forward" not in vars(m)
        ]
        self._gate_up_masters = [
            (mlp, [mlp.gate_proj.weight, mlp.up_proj.weight])
            for mlp, _ in self._gate_up
            if id(mlp.gate_proj) in accumulate and mlp.gate_proj.weight.requires_grad
        ]
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
            for mlp, masters in self._gate_up_masters:
                mlp._vime_gate_up_masters = masters
            for module, forward in self._forwards:
                module.forward = forward
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for module, name, master, _ in self._slots:
                    module._parameters[name] = master
                for mlp, _ in self._gate_up:
                    del mlp._vime_gate_up
                for mlp, _ in self._gate_up_masters:
                    del mlp._vime_gate_up_masters
                for module, _ in self._forwards:
                    del module.forward


def _fused_pair(
    mlp: torch.nn.Module, dtype: torch.dtype, copies: dict[int, torch.nn.Parameter]
) -> torch.nn.Parameter:
    """One ``dtype`` tensor holding the copies of ``mlp``'s gate and up weights, which are
    entered in ``copies`` as views of its halves (refreshing them fills it)."""
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

    def hook(copy: torch.Tensor) -> None:
        if copy.grad is None:  # its gradient went straight into the master (_LinearIntoMasters)
            return
        if master.grad is None:
            master.grad = copy.grad.to(torch.float32)
        else:
            master.grad.add_(copy.grad)
        copy.grad = None

    return hook


def _add_halves_into(masters: list[torch.nn.Parameter]) -> Any:
    """The hook that moves a fused copy's finished gradient into its masters' ``.grad``."""

    def hook(fused: torch.Tensor) -> None:
        if fused.grad is None:  # its gradient went straight into the masters
            return
        for master, part in zip(masters, fused.grad.chunk(len(masters)), strict=True):
            if master.grad is None:
                master.grad = part.to(torch.float32)
            else:
                master.grad.add_(part)
        fused.grad = None

    return hook


def _accumulating_forward(linear: torch.nn.Module, master: torch.nn.Parameter) -> Any:
    """``linear``'s forward while the copy fills its weight slot, the weight's gradient added
    into ``master``'s float32 ``.grad`` by :func:`linear_into_masters`."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return linear_into_masters(x, linear.weight, linear.bias, [master])

    return forward


def linear_into_masters(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    masters: Sequence[torch.nn.Parameter],
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` whose backward adds the weight's gradient into the float32
    ``.grad`` of ``masters`` (their rows stacked make ``weight``'s rows, in order) and gives
    ``weight`` none; ``x`` and ``bias`` get theirs through autograd as usual."""
    return _LinearIntoMasters.apply(x, weight, bias, tuple(masters))


class _LinearIntoMasters(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any, masters: Any) -> Any:
        ctx.save_for_backward(x, weight)
        ctx.masters, ctx.has_bias = masters, bias is not None
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, weight = ctx.saved_tensors
        grad_x = grad @ weight if ctx.needs_input_grad[0] else None
        rows_in, rows_out = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        start = 0
        for master in ctx.masters:
            stop = start + master.shape[0]
            if master.grad is None:  # the first micro-batch's: written, not added to zeros
                master.grad = wgrad_gemm_fp32(rows_in, rows_out[:, start:stop])
            else:
                wgrad_gemm_accum_fp32(rows_in, rows_out[:, start:stop], master.grad)
            start = stop
        grad_bias = rows_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias, None
