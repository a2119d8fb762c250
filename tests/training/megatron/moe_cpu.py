"""Workers for the MoE tests that spawned processes import by name: the shim for expert
parallelism's dispatcher and one train step with every parameter's full gradient and weights,
gathered over expert-parallel ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from megatron_cpu import cpu_shim, run_one_step


class _HostStream:
    """Stands in for the CUDA side stream megatron-core's all-to-all dispatcher copies its
    split sizes on: on the CPU everything is already on the host and in order."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _HostStream:
        global _STREAM
        if _STREAM is None:
            _STREAM = super().__new__(cls)
        return _STREAM

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self) -> Any:
        return self

    def synchronize(self) -> None:
        pass


_STREAM: _HostStream | None = None


@contextlib.contextmanager
def moe_shim() -> Iterator[None]:
    """``cpu_shim`` plus the CUDA stream calls of expert parallelism's token dispatcher."""
    patches = {
        "Stream": _HostStream,
        "current_stream": lambda *a, **k: _HostStream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
    }
    saved = {name: getattr(torch.cuda, name) for name in patches}
    from megatron.core.transformer.moe import token_dispatcher

    to_host = token_dispatcher.maybe_move_tensor_to_cpu
    with cpu_shim():
        try:
            for name, value in patches.items():
                setattr(torch.cuda, name, value)
            token_dispatcher.maybe_move_tensor_to_cpu = _split_sizes_to_host
            yield
        finally:
            for name, value in saved.items():
                setattr(torch.cuda, name, value)
            token_dispatcher.maybe_move_tensor_to_cpu = to_host


def _split_sizes_to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron-core's copy of the all-to-all split sizes to the host: it turns only CUDA
    tensors into the numpy arrays the collective takes, so do it for CPU ones too."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _full(trainer: Any, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor under its full-model name: expert tensors gathered over the EP group (each
    rank holds other experts under the same local names), the rest as this rank holds them."""
    import torch.distributed as dist

    from vime.training.megatron.convert import expert_to_global, is_expert

    out = {}
    for name, tensor in local.items():
        tensor = tensor.detach().float().contiguous()
        if trainer.ep_size > 1 and is_expert(name):
            pieces = [torch.empty_like(tensor) for _ in range(trainer.ep_size)]
            dist.all_gather(pieces, tensor, group=trainer.ep_group)
            for ep_rank, piece in enumerate(pieces):
                out[expert_to_global(name, ep_rank, trainer.experts_per_rank)] = piece.clone()
        else:
            out[name] = tensor.clone()
    return out


def moe_step(folder: str, args: list[str], token_lists: list[list[int]]) -> dict[str, Any]:
    """One rank of one train step (:func:`megatron_cpu.run_one_step`) under the MoE shim, one
    sequence per micro-batch, experts gathered over the EP group."""
    return run_one_step(folder, args, token_lists, gather=_full, shim=moe_shim, per_sequence=True)
