"""Test helpers that spawned processes import by name: the CPU shim and distributed workers.

megatron-core hard-codes CUDA in a few places (``torch.cuda.current_device()`` for RoPE and
buffers, ``device='cuda'`` in optimizer scalars, a ``torch.cuda.FloatTensor`` type assertion in
gradient clipping). Inside ``cpu_shim()`` those resolve to the CPU; nothing in vime uses it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like")


def _to_cpu(device: Any) -> Any:
    if device is None:
        return None
    if isinstance(device, int) or str(device).startswith("cuda"):
        return "cpu"
    return device


def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        return fn(*args, **kwargs)

    return call


def _cuda_type_name(original: Any) -> Any:
    """``Tensor.type()`` naming CPU tensors as CUDA ones (Megatron asserts the name)."""

    @functools.wraps(original)
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return original(self, *args, **kwargs)
        return original(self).replace("torch.", "torch.cuda.", 1)

    return type_


@contextlib.contextmanager
def cpu_shim() -> Iterator[None]:
    """Redirect megatron-core's hard-coded CUDA device uses to the CPU inside the block."""
    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.Tensor, "cuda", lambda self, *a, **k: self),
        (torch.Tensor, "type", _cuda_type_name(torch.Tensor.type)),
    ]
    patches += [(torch, name, _wrap(getattr(torch, name))) for name in _FACTORIES]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def signed_batch(token_lists: list[list[int]]) -> Any:
    """A batch of the given sequences: loss on all but two prompt tokens, advantages +1/-1."""
    from vime.training.batch import TrainBatch, TrainSample

    samples = []
    for i, ids in enumerate(token_lists):
        mask = [0, 0] + [1] * (len(ids) - 2)
        sign = 1.0 if i % 2 == 0 else -1.0
        samples.append(
            TrainSample(
                token_ids=ids,
                loss_mask=mask,
                advantages=[sign * m for m in mask],
                rollout_logprobs=[-2.0 * m for m in mask],
            )
        )
    return TrainBatch(samples)


def run_per_sequence(folder: str, args: list[str], token_lists: list[list[int]]) -> dict[str, Any]:
    """:func:`run_one_step` with one sequence per micro-batch: data-parallel ranks then hold
    unequal numbers of micro-batches, and the rank with fewer runs dummy ones."""
    return run_one_step(folder, args, token_lists, per_sequence=True)


def _full_on_every_rank(trainer: Any, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor made whole through ``convert.unshard``: split ones gathered over the TP group,
    replicated ones as this rank holds them (so ranks that disagree show it)."""
    import torch.distributed as dist

    from vime.training.megatron.convert import tp_split_dim, unshard

    tp = dist.get_world_size(trainer.tp_group)
    out = {}
    for name, tensor in local.items():
        tensor = tensor.detach().float().contiguous()
        if tp > 1 and tp_split_dim(name) is not None:
            pieces = [torch.empty_like(tensor) for _ in range(tp)]
            dist.all_gather(pieces, tensor, group=trainer.tp_group)
            tensor = unshard(name, pieces)
        out[name] = tensor.clone()
    return out


Gather = Callable[[Any, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def run_one_step(
    folder: str,
    args: list[str],
    token_lists: list[list[int]],
    *,
    gather: Gather = _full_on_every_rank,
    shim: Callable[[], contextlib.AbstractContextManager[Any]] = cpu_shim,
    per_sequence: bool = False,
    watch: Callable[[Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One rank of one Megatron train step on CPU, the one way these tests run a step.

    Returns the logprobs ``before`` the step, the HF ``exported`` weights before it (rank 0's;
    empty elsewhere), the full gradient the optimizer is handed (before clipping), the step's
    ``metrics`` and ``step_logprobs``, the full ``weights`` after the step and the logprobs
    ``after`` it, and which of this rank's micro-batches are ``dummies``.
    ``gather(trainer, local)`` makes this rank's tensors full-model ones (TP shards by default;
    experts, pipeline stages). ``per_sequence`` puts one sequence in each
    micro-batch (else one micro-batch holds them all). ``watch(trainer)``, called before the
    step, returns a dict filled in during it, merged into the result.
    """
    from vime.training.base import TrainerConfig
    from vime.training.megatron.trainer import MegatronTrainer

    batch = signed_batch(token_lists)
    with shim():
        config = TrainerConfig(
            hf_checkpoint=folder,
            backend="megatron",
            seed=7,
            lr=1e-3,
            max_tokens_per_micro_batch=max(map(len, token_lists)) if per_sequence else 8192,
        )
        trainer = MegatronTrainer(config, megatron_args=args)
        before = [t.tolist() for t in trainer.compute_logprobs(batch)]
        exported = {n: t.clone() for b in trainer.export_weights() for n, t in b}
        grads: dict[str, torch.Tensor] = {}
        step = trainer.optimizer.step

        def step_after_snapshot() -> Any:
            named = trainer.module.named_parameters()
            grads.update(gather(trainer, {n: p.main_grad for n, p in named}))
            return step()

        trainer.optimizer.step = step_after_snapshot
        watched = {} if watch is None else watch(trainer)
        dummies = [mb.dummy for mb in trainer._plan(batch)]
        metrics = trainer.train_step(batch)
        step_logprobs = [t.tolist() for t in trainer.step_logprobs()]
        weights = gather(trainer, dict(trainer.module.named_parameters()))
        after = [t.tolist() for t in trainer.compute_logprobs(batch)]
    return {
        "before": before,
        "exported": exported,
        "grads": grads,
        "metrics": metrics,
        "step_logprobs": step_logprobs,
        "weights": weights,
        "after": after,
        "dummies": dummies,
        **watched,
    }


def grads_and_outputs(folder: str, args: list[str]) -> tuple:
    """One process's packed logprobs, entropy and every parameter's gradient of a fixed weighted
    sum of both, for a fused/unfused comparison. Run it in a fresh process (``spawn``): in the
    pytest process, torch.compile'd kernels and megatron's state changed later tests' results."""
    with cpu_shim():
        return _grads_and_outputs_in_shim(folder, args)


def _grads_and_outputs_in_shim(folder: str, args: list[str]) -> tuple:
    from vime.training.base import TrainerConfig
    from vime.training.megatron.trainer import MegatronTrainer
    from vime.training.packing import MicroBatch, pack_inputs

    cfg = TrainerConfig(hf_checkpoint=str(folder), backend="megatron", seed=7)
    trainer = MegatronTrainer(cfg, megatron_args=list(args))
    g = torch.Generator().manual_seed(5)
    batch = signed_batch([torch.randint(0, 96, (n,), generator=g).tolist() for n in (13, 8)])
    inputs = pack_inputs(batch.samples, MicroBatch(indices=(0, 1), num_tokens=21))
    trainer._zero_grad()
    logprobs, entropy = trainer._token_logprobs_and_entropy(inputs)
    w = torch.linspace(-1.0, 1.0, logprobs.numel())
    (logprobs * w).sum().add(entropy.sum() * 0.3).backward()
    trainer._reduce_gradients()
    grads = {n: p.main_grad.detach().clone() for n, p in trainer.model.named_parameters()}
    return logprobs.detach(), entropy.detach(), grads
