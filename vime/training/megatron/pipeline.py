"""Pipeline parallelism for the Megatron backend: stage layout, layer naming, activation passing.

Each pipeline stage builds only its own decoder layers (megatron-core numbers them locally,
``decoder.layers.0 ..``); :func:`to_global_layer` / :func:`to_local_layer` map those names to
and from the full model's, which the HF converter uses. The first stage holds the embedding,
the last the final norm and output layer (with tied embeddings, a copy of the word embedding
whose gradient megatron-core's ``finalize_model_grads`` sums with the first stage's).

A training step runs the micro-batches in the 1F1B schedule (:func:`one_f_one_b`): stage ``r``
of ``p`` first runs ``p - r - 1`` forward passes, then alternates one forward and one backward,
then runs the backward passes left. Hidden states go forward and their gradients back by
point-to-point messages (sends are asynchronous, receives wait), so stages work on different
micro-batches at once and a stage holds at most ``p - r`` micro-batches' activations. The
base trainer's micro-batch losses and normalisers are unchanged; only their order differs.
megatron-core's own schedules (``get_forward_backward_func``) are not used: they scale each
loss by the micro-batch count or their own token count, set the MoE auxiliary loss's scale
themselves and need fixed (or separately exchanged) activation shapes, while the base trainer's
losses already carry the step's global normalisers and its packed micro-batches vary in length.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")
Pass = Literal["F", "B"]  # a forward or a backward pass of one micro-batch
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


def one_f_one_b(pp_size: int, pp_rank: int, num_micro_batches: int) -> list[tuple[Pass, int]]:
    """Stage ``pp_rank``'s passes in the 1F1B schedule: ``("F", i)`` / ``("B", i)`` the forward /
    backward pass of micro-batch ``i``. Warm-up: ``pp_size - pp_rank - 1`` forwards (at most
    all); steady state: one forward, then the backward of the oldest micro-batch in flight;
    cool-down: the remaining backwards. Forwards and backwards each run in micro-batch order."""
    warmup = min(pp_size - pp_rank - 1, num_micro_batches)
    order: list[tuple[Pass, int]] = [("F", i) for i in range(warmup)]
    for i in range(warmup, num_micro_batches):
        order += [("F", i), ("B", i - warmup)]
    order += [("B", i) for i in range(num_micro_batches - warmup, num_micro_batches)]
    return order


@dataclass
class PipelineStage:
    """This rank's pipeline stage (``size == 1``: no pipeline, one stage that is both ends)."""

    size: int = 1
    rank: int = 0
    offset: int = 0  # global index of the stage's first decoder layer
    group: Any = None
    prev_rank: int | None = None  # global ranks of the neighbouring stages' matching processes
    next_rank: int | None = None
    _sends: list[tuple[Any, torch.Tensor]] = field(default_factory=list, repr=False)
    _received: torch.Tensor | None = field(default=None, repr=False)

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
        """The previous stage's output for the next micro-batch. In grad mode it takes
        gradients, which :meth:`run_1f1b` sends back after the micro-batch's backward pass."""
        hidden = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(hidden, src=self.prev_rank)
        if torch.is_grad_enabled():
            hidden.requires_grad_(True)
            self._received = hidden
        return hidden

    def send_hidden(self, hidden: torch.Tensor) -> None:
        """Pass this stage's output to the next stage without waiting for it to arrive
        (:meth:`wait_sends` does)."""
        self._isend(hidden.detach().contiguous(), self.next_rank)

    def _isend(self, tensor: torch.Tensor, dst: int | None) -> None:
        # The tensor stays referenced until its send completes.
        self._sends.append((dist.isend(tensor, dst=dst), tensor))

    def wait_sends(self) -> None:
        """Wait until every message this stage sent has arrived."""
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    def run_1f1b(self, plan: Sequence[T], forward: Callable[[T], torch.Tensor]) -> list[Any]:
        """Forward and backward passes of every micro-batch in ``plan``, in the order of
        :func:`one_f_one_b`. ``forward(mb)`` runs this stage's forward pass of ``mb`` and returns
        its loss on the last stage, its output hidden states (sent on) on the others; the
        backward pass starts from that loss, or from the gradient the next stage sends back.
        Returns the detached losses (the last stage; none elsewhere)."""
        pending: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        losses: list[Any] = []
        for kind, i in one_f_one_b(self.size, self.rank, len(plan)):
            if kind == "F":
                self._received = None
                out = forward(plan[i])
                pending[i] = (self._received, out)
                if self.last:
                    losses.append(out.detach())
                continue
            received, out = pending.pop(i)
            if self.last:
                out.backward()
            else:
                grad = torch.empty_like(out)
                dist.recv(grad, src=self.next_rank)
                torch.autograd.backward(out, grad)
            if received is not None:
                grad = received.grad
                self._isend(torch.zeros_like(received) if grad is None else grad, self.prev_rank)
        self._received = None
        self.wait_sends()
        return losses

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
