"""Workers of the pipeline-parallel CPU tests (spawned processes import them by name)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron_cpu import _full_on_every_rank, cpu_shim, run_one_step, signed_batch


def _whole_model(trainer: Any, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full tensors of every stage under the full model's names, on every rank. A tied
    embedding's two copies (first and last stage) must agree; that is checked here."""
    mine = {trainer._global_name(n): t for n, t in _full_on_every_rank(trainer, local).items()}
    stage = trainer.stage
    if stage.size == 1:
        return mine
    parts: list[Any] = [None] * stage.size
    dist.all_gather_object(parts, mine, group=stage.group)
    whole: dict[str, torch.Tensor] = {}
    for part in parts:
        for name, tensor in part.items():
            if name in whole and not torch.equal(whole[name], tensor):
                raise AssertionError(f"the stages' copies of {name} differ")
            whole[name] = tensor
    return whole


def _trace_passes(trainer: Any) -> dict[str, Any]:
    """Records the order in which this stage runs its passes during the step: ``("F", i)``
    when the forward pass of its ``i``-th micro-batch runs, ``("B", i)`` when autograd reaches
    that forward's result (the loss, or the hidden states sent on) in the backward pass."""
    trace: list[tuple[str, int]] = []
    forward = trainer._micro_batch_loss

    def traced(*args: Any, **kwargs: Any) -> torch.Tensor:
        i = sum(kind == "F" for kind, _ in trace)
        trace.append(("F", i))
        out = forward(*args, **kwargs)
        out.register_hook(lambda grad: trace.append(("B", i)))
        return out

    trainer._micro_batch_loss = traced
    return {"trace": trace, "stage": (trainer.stage.size, trainer.stage.rank)}


def run_step(folder: str, args: list[str], token_lists: list[list[int]]) -> dict[str, Any]:
    """One rank of one train step (:func:`megatron_cpu.run_one_step`), one sequence per
    micro-batch, every stage's tensors gathered on every rank, the order of its passes
    traced."""
    return run_one_step(
        folder, args, token_lists, gather=_whole_model, per_sequence=True, watch=_trace_passes
    )


def run_resume(
    folder: str, args: list[str], token_lists: list[list[int]], ckpt_dir: str
) -> dict[str, Any]:
    """One rank: a step, a checkpoint, a second step; then a fresh trainer loads the checkpoint
    and takes the second step again. Returns both second steps' metrics and exports."""
    from vime.training.base import TrainerConfig
    from vime.training.megatron.trainer import MegatronTrainer

    batch = signed_batch(token_lists)
    with cpu_shim():
        config = TrainerConfig(hf_checkpoint=folder, backend="megatron", seed=7, lr=1e-3)
        trainer = MegatronTrainer(config, megatron_args=args)
        trainer.train_step(batch)
        trainer.save(ckpt_dir)
        first = trainer.train_step(batch)
        first_export = {n: t.clone() for b in trainer.export_weights() for n, t in b}
        resumed = MegatronTrainer(config, megatron_args=args)
        resumed.load(ckpt_dir)
        version = resumed.weight_version
        second = resumed.train_step(batch)
        second_export = {n: t.clone() for b in resumed.export_weights() for n, t in b}
    return {
        "first": first,
        "second": second,
        "version": version,
        "first_export": first_export,
        "second_export": second_export,
    }
