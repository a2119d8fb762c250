"""Pipeline parallelism for the Megatron backend: stage layout, layer naming, activation passing.

Each pipeline stage builds only its own decoder layers (megatron-core numbers them locally,
``decoder.layers.0 ..``); :func:`to_global_layer` / :func:`to_local_layer` map those names to
and from the full model's, which the HF converter uses. The first stage holds the embedding,
the last the final norm and output layer (with tied embeddings, a copy of the word embedding
whose gradient megatron-core's ``finalize_model_grads`` sums with the first stage's).

Micro-batches pass through the stages one at a time: a stage receives the previous stage's
hidden states, runs its layers and sends them on; the backward pass returns the gradient of
those hidden states the same way (:meth:`PipelineStage.stand_in_loss`). This keeps the base
trainer's micro-batch loop and its loss normalisers unchanged; it does not overlap stages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

_LAYER = re.compile(r"((?:.*\.)?decoder\.layers\.)(\d+)(\..+)")


def to_global_layer(name: str, offset: int) -> str:
    """A stage's parameter name with its local layer index made global (``+ offset``)."""
    m = _LAYER.fullmatch(name)
    if m is None or offset == 0:
        return name
    return f"{m.group(1)}{int(m.group(2)) + offset}{m.group(3)}"


def to_local_layer(name: str, offset: int) -> str:
    """Inverse of :func:`to_global_layer`; raises ``ValueError`` for a layer of an earlier stage."""
    m = _LAYER.fullmatch(name)
    if m is None or offset == 0:
        return name
    index = int(m.group(2)) - offset
    if index < 0:
        raise ValueError(f"{name!r} belongs to a stage before layer offset {offset}")
    return f"{m.group(1)}{index}{m.group(3)}"


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """The global decoder layers of stage ``pp_rank`` (an even split, as megatron-core makes
    without a custom layout)."""
    if num_layers % pp_size:
        raise ValueError(f"{num_layers} layers do not split evenly into {pp_size} stages")
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


@dataclass
class PipelineStage:
    """This rank's pipeline stage (``size == 1``: no pipeline, one stage that is both ends)."""

    size: int = 1
    rank: int = 0
    offset: int = 0  # global index of the stage's first decoder layer
    group: Any = None
    prev_rank: int | None = None  # global ranks of the neighbouring stages' matching processes
    next_rank: int | None = None

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.size - 1

    @classmethod
    def current(cls, config: Any) -> PipelineStage:
        """The stage megatron-core's process groups give this process."""
        from megatron.core import parallel_state as mpu
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        size = mpu.get_pipeline_model_parallel_world_size()
        if size == 1:
            return cls()
        rank = mpu.get_pipeline_model_parallel_rank()
        return cls(
            size=size,
            rank=rank,
            offset=get_transformer_layer_offset(config, pp_rank=rank),
            group=mpu.get_pipeline_model_parallel_group(),
            prev_rank=None if rank == 0 else mpu.get_pipeline_model_parallel_prev_rank(),
            next_rank=None if rank == size - 1 else mpu.get_pipeline_model_parallel_next_rank(),
        )

    def stage_rank(self, pp_rank: int) -> int:
        """Global rank of stage ``pp_rank``'s process in this process's pipeline group."""
        return dist.get_global_rank(self.group, pp_rank)

    def receive_hidden(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any) -> Any:
        """The previous stage's output for this micro-batch; it takes gradients when grad mode
        is on, and :meth:`stand_in_loss` of the previous stage receives them."""
        hidden = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(hidden, src=self.prev_rank)
        if torch.is_grad_enabled():
            hidden.requires_grad_(True)
            hidden.register_hook(self._send_grad)
        return hidden

    def _send_grad(self, grad: torch.Tensor) -> None:
        dist.send(grad.contiguous(), dst=self.prev_rank)

    def send_hidden(self, hidden: torch.Tensor) -> None:
        """Pass this stage's output to the next stage."""
        dist.send(hidden.detach().contiguous(), dst=self.next_rank)

    def stand_in_loss(self, hidden: torch.Tensor) -> torch.Tensor:
        """A zero-valued loss whose backward pass sends ``hidden`` the gradient the next stage
        computed for it (received here, so call it after :meth:`send_hidden`)."""
        grad = torch.empty_like(hidden)
        dist.recv(grad, src=self.next_rank)
        surrogate = (hidden * grad).sum()
        return surrogate - surrogate.detach()

    def from_last(self, obj: Any) -> Any:
        """``obj`` as the last stage has it, on every stage of this pipeline."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.stage_rank(self.size - 1), group=self.group)
        return box[0]

    def gather_to_first(
        self, items: Iterator[tuple[str, torch.Tensor]], active: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Every stage's (name, tensor) pairs, stage by stage, on stage 0; the other stages
        yield none. ``items`` is exhausted on every rank (it may run collectives); only an
        ``active`` pipeline group (the same on all its members) passes tensors on."""
        mine = list(items)
        if not active:
            return
        if self.first:
            yield from mine
        for src in range(1, self.size):
            box = [[(n, t.shape, t.dtype) for n, t in mine] if self.rank == src else None]
            dist.broadcast_object_list(box, src=self.stage_rank(src), group=self.group)
            for i, (name, shape, dtype) in enumerate(box[0]):
                if self.rank == src:
                    tensor = mine[i][1].contiguous()
                elif self.first:
                    tensor = torch.empty(shape, dtype=dtype, device=mine[0][1].device)
                else:
                    continue
                _pair(tensor, self, src)
                if self.first:
                    yield name, tensor


def _pair(tensor: torch.Tensor, stage: PipelineStage, src: int) -> None:
    """Send ``tensor`` from stage ``src`` to stage 0 (the only two that take part)."""
    if stage.rank == src:
        dist.send(tensor, dst=stage.stage_rank(0))
    else:
        dist.recv(tensor, src=stage.stage_rank(src))
