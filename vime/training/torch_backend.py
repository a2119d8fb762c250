"""The embedded trainer: a transformers causal LM trained with plain torch (FSDP2 when distributed).

Micro-batches are packed sequences under a token budget; the loss of each is normalised by the
whole step's token/sequence counts, so gradient accumulation and data parallelism give exactly
the gradient of one big batch.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vime.training import checkpoint as ckpt
from vime.training.base import Trainer, TrainerConfig
from vime.training.batch import TrainBatch, TrainSample
from vime.training.buckets import DEFAULT_BUCKET_BYTES, bucket_tensors
from vime.training.metrics import MetricSums
from vime.training.packing import MicroBatch, PackedInputs, pack_inputs, plan_micro_batches

if TYPE_CHECKING:
    import torch

    from vime.algorithms.config import LossConfig


class TorchTrainer(Trainer):
    """Trainer backend on transformers + torch; SPMD over the default process group if any.

    Parameters stay float32 (the optimizer's master copy); with ``dtype=bfloat16`` the
    forward and backward run in bf16 (FSDP2 mixed precision, or autocast in one process).
    """

    def __init__(self, config: TrainerConfig, loss: LossConfig | None = None) -> None:
        import torch
        import torch.distributed as dist

        from vime.algorithms.config import LossConfig

        if not config.hf_checkpoint:
            raise ValueError("TorchTrainer needs --hf-checkpoint, the HF model folder to train")
        self.config = config
        self.loss_config = loss or LossConfig()
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        dtype = config.dtype
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.compute_dtype = getattr(torch, dtype)
        torch.manual_seed(config.seed + self.rank)
        self.model = self._load_model()
        from vime.training.optim import build_optimizer

        self.optimizer, self.schedule = build_optimizer(self.model, config)
        self._weight_version = 0
        self._step_logprobs: dict[int, torch.Tensor] = {}  # of the last train_step
        self._step_size = 0

    def _load_model(self) -> torch.nn.Module:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.config.hf_checkpoint,
            dtype=torch.float32,
            attn_implementation=self.config.attn_implementation,
        ).to(self.device)
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if self.distributed:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh(self.device.type, (self.world_size,))
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
        return model

    @property
    def weight_version(self) -> int:
        """Optimizer steps applied since the HF weights were loaded."""
        return self._weight_version

    # ---- forward ---------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        import torch

        if self.distributed or self.compute_dtype == torch.float32:
            return contextlib.nullcontext()  # FSDP2's policy casts, or nothing to cast
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _forward(self, inputs: PackedInputs) -> torch.Tensor:
        """Float32 logits ``[T, V]`` of a packed row, divided by the rollout temperature."""
        with self._autocast():
            out = self.model(
                input_ids=inputs.input_ids.to(self.device),
                position_ids=inputs.position_ids.to(self.device),
                # A cache would make transformers skip packed-sequence detection and let
                # attention cross sequence boundaries.
                use_cache=False,
            )
        logits = out.logits[0].float()
        if self.config.rollout_temperature != 1.0:
            logits = logits / self.config.rollout_temperature
        return logits

    @staticmethod
    def _token_logprobs(logits: torch.Tensor, inputs: PackedInputs) -> list[torch.Tensor]:
        """Per-sequence logprobs of the packed row: entry i is log p(x_i | x_<i), entry 0 is 0."""

        ids = inputs.input_ids[0].to(logits.device)
        nxt = logits[:-1].gather(-1, ids[1:, None])[:, 0] - logits[:-1].logsumexp(-1)
        return TorchTrainer._split_shifted(nxt, inputs)

    @staticmethod
    def _split_shifted(per_row: torch.Tensor, inputs: PackedInputs) -> list[torch.Tensor]:
        """Per-sequence tensors from values of logits rows: row t belongs to token t + 1.

        The row before each sequence's start (the previous sequence's last token) is dropped
        and entry 0 of each sequence is 0.0, which nothing predicts.
        """
        import torch

        zero = per_row.new_zeros(1)
        cu = inputs.cu_seqlens
        return [torch.cat([zero, per_row[a : b - 1]]) for a, b in itertools.pairwise(cu)]

    def _plan(self, batch: TrainBatch) -> list[MicroBatch]:
        lengths = [s.num_tokens for s in batch]
        plan = plan_micro_batches(lengths, self.config.max_tokens_per_micro_batch, self.world_size)
        return plan[self.rank]

    # ---- logprobs --------------------------------------------------------------------------

    def compute_logprobs(self, batch: TrainBatch) -> list[torch.Tensor]:
        """Current-policy logprobs per sample (float32, CPU), identical on every rank."""
        import torch

        if not batch.samples:
            return []
        mine: dict[int, torch.Tensor] = {}
        self.model.eval()
        with torch.no_grad():
            for mb in self._plan(batch):
                inputs = pack_inputs(batch.samples, mb)
                logprobs = self._token_logprobs(self._forward(inputs), inputs)
                if not mb.dummy:
                    for i, lp in zip(mb.indices, logprobs, strict=True):
                        mine[i] = lp.float().cpu()
        return self._gathered(mine, len(batch))

    def _gathered(self, mine: dict[int, torch.Tensor], n: int) -> list[torch.Tensor]:
        """Per-sample tensors in batch order from this rank's share, on every rank."""
        import torch.distributed as dist

        if self.distributed:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine)
            for part in gathered:
                mine.update(part)
        return [mine[i] for i in range(n)]

    def step_logprobs(self) -> list[torch.Tensor]:
        """See :meth:`Trainer.step_logprobs`: kept from the loss's own forward, no extra pass."""
        return self._gathered(dict(self._step_logprobs), self._step_size)

    # ---- training --------------------------------------------------------------------------

    def _padded(self, samples: list[TrainSample], field: str) -> torch.Tensor | None:
        """A ``[B, T]`` float tensor of a per-token field, or None when no sample has it."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        values = [getattr(s, field) for s in samples]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError(
                f"some samples have {field} and some do not; give it to all or none of them"
            )
        rows = [torch.tensor(v, dtype=torch.float32) for v in values]
        return pad_sequence(rows, batch_first=True).to(self.device)

    def _micro_batch_loss(
        self,
        samples: list[TrainSample],
        mb: MicroBatch,
        num_tokens: float,
        num_seqs: float,
        sums: MetricSums,
    ) -> torch.Tensor:
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from vime.algorithms.kl import entropy_from_logits
        from vime.algorithms.policy import policy_loss

        inputs = pack_inputs(samples, mb)
        logits = self._forward(inputs)
        per_seq = self._token_logprobs(logits, inputs)
        if mb.dummy:
            return torch.cat(per_seq).sum() * 0.0  # joins the collectives, adds no gradient
        for i, lp in zip(mb.indices, per_seq, strict=True):
            self._step_logprobs[i] = lp.detach().float().cpu()
        chosen = [samples[i] for i in mb.indices]
        starts = inputs.cu_seqlens[:-1]
        mask = pad_sequence(
            [torch.tensor(s.loss_mask, dtype=torch.float32) for s in chosen], batch_first=True
        ).to(self.device)
        entropy = None
        if self.loss_config.entropy_coef > 0:
            flat = entropy_from_logits(logits)
            entropy = pad_sequence(self._split_shifted(flat, inputs), batch_first=True)
        loss, metrics = policy_loss(
            pad_sequence(per_seq, batch_first=True),
            self._padded(chosen, "old_logprobs"),
            self._padded(chosen, "advantages"),
            mask,
            self.loss_config,
            rollout_logprobs=self._padded(chosen, "rollout_logprobs"),
            ref_logprobs=self._padded(chosen, "ref_logprobs"),
            entropy=entropy,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        if entropy is None:
            # Token j of a sequence starting at a is predicted by logits row a + j - 1.
            rows = [
                a + j - 1
                for s, a in zip(chosen, starts, strict=True)
                for j, m in enumerate(s.loss_mask)
                if m
            ]
            with torch.no_grad():
                metrics["policy/entropy"] = float(entropy_from_logits(logits[rows]).mean())
        metrics.pop("policy/loss")  # a share of the step's loss; train_step reports the total
        sums.add(metrics, weight=metrics["policy/num_tokens"])
        return loss

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW step over the batch; see :meth:`Trainer.train_step`."""
        batch.require_loss_tokens()
        start = time.perf_counter()
        # The global normalisers of the loss (as vime.algorithms.count_loss_units counts them).
        num_tokens = batch.num_loss_tokens
        num_seqs = sum(1 for s in batch if s.num_loss_tokens > 0)
        # Gradients are averaged over ranks, so each rank scales its share by world_size.
        scale_tokens = num_tokens / self.world_size
        scale_seqs = num_seqs / self.world_size
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = MetricSums()
        plan = self._plan(batch)
        self._step_logprobs = {}
        self._step_size = len(batch)
        loss_total = 0.0
        for mb in plan:
            loss = self._micro_batch_loss(batch.samples, mb, scale_tokens, scale_seqs, sums)
            loss.backward()
            loss_total += float(loss.detach())
        grad_norm = self._clip_grad()
        lr = self.schedule.apply_next()
        self.optimizer.step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._weight_version += 1
        metrics = sums.reduce(self.distributed, str(self.device))
        elapsed = time.perf_counter() - start
        metrics.update(
            {
                "loss": self._sum_across_ranks(loss_total) / self.world_size,
                "grad_norm": grad_norm,
                "lr": lr,
                "num_tokens": float(batch.num_tokens),
                "num_loss_tokens": float(num_tokens),
                "num_micro_batches": float(len(plan)),
                "step_time_s": elapsed,
                "tokens_per_s": batch.num_tokens / elapsed,
                "weight_version": float(self._weight_version),
            }
        )
        return metrics

    def _clip_grad(self) -> float:
        import torch

        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.clip_grad if self.config.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def _sum_across_ranks(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t[0])

    # ---- weights ---------------------------------------------------------------------------

    def _named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters (tied ones once, under their first name) and persistent buffers."""
        yield from self.model.named_parameters()
        persistent = set(self.model.state_dict().keys())
        for name, buf in self.model.named_buffers():
            if name in persistent:
                yield name, buf

    def export_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full tensors under HF names in buckets, on rank 0; see :meth:`Trainer.export_weights`.

        In one process the tensors alias the live parameters: copy them to keep them past
        the next ``train_step``.
        """
        yield from bucket_tensors(self._rank0_full_weights(), bucket_bytes)

    def _rank0_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        # Every rank gathers (full_tensor is a collective); only rank 0 keeps the result.
        for name, tensor in self._named_weights():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if self.rank == 0:
                yield name, full.detach()

    # ---- checkpoints -----------------------------------------------------------------------

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.distributed:
            dist.barrier()

    def save(self, directory: str | Path) -> Path:
        """Atomic checkpoint: full model and optimizer state (rank 0), RNG state per rank."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        gathered: dict[str, Any] = {}

        def write_rank(tmp: Path) -> None:
            # Gathering the full state is a collective: every rank takes part.
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            gathered["model"], gathered["optimizer"] = get_state_dict(
                self.model, self.optimizer, options=options
            )
            ckpt.save_object(ckpt.rng_state(), tmp / f"rng_rank{self.rank}.pt")

        def write_main(tmp: Path) -> None:
            ckpt.save_object(gathered["model"], tmp / "model.pt")
            ckpt.save_object(gathered["optimizer"], tmp / "optimizer.pt")

        state = {
            "weight_version": self._weight_version,
            "schedule": self.schedule.state_dict(),
            "world_size": self.world_size,
            "hf_checkpoint": self.config.hf_checkpoint,
        }
        return ckpt.save_distributed(
            directory,
            rank=self.rank,
            barrier=self._barrier,
            write_rank=write_rank,
            write_main=write_main,
            trainer_state=state,
            backend="torch",
        )

    def load(self, directory: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` (any world size)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        directory = Path(directory)
        state = ckpt.read_trainer_state(directory, "torch")
        if self.distributed:
            # Only rank 0 reads the full tensors; FSDP2 broadcasts and shards them.
            model_state = ckpt.load_object(directory / "model.pt") if self.rank == 0 else {}
            optim_state = ckpt.load_object(directory / "optimizer.pt") if self.rank == 0 else {}
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        else:
            model_state = ckpt.load_object(directory / "model.pt")
            optim_state = ckpt.load_object(directory / "optimizer.pt")
            options = StateDictOptions(full_state_dict=True)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=model_state,
            optim_state_dict=optim_state,
            options=options,
        )
        self.schedule.load_state_dict(state["schedule"])
        self._weight_version = int(state["weight_version"])
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            ckpt.set_rng_state(ckpt.load_object(rng_file))
        self._barrier()
