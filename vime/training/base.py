"""The trainer interface, the training-step algorithm both backends share, and its config.

Flag names follow Megatron's own (``--lr``, ``--clip-grad``, ``--adam-beta1``...), so one flag
means the same thing whichever backend runs. :class:`Trainer` owns the step (micro-batches,
loss normalisers, dummy micro-batches, metrics, errors); a backend supplies the forward pass,
token logprobs, entropy, gradient reduction and the optimizer step.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from vime.config.schema import option
from vime.errors import ConfigError
from vime.training.buckets import DEFAULT_BUCKET_BYTES

if TYPE_CHECKING:
    import torch

    from vime.algorithms.config import LossConfig
    from vime.training.batch import TrainBatch, TrainSample
    from vime.training.metrics import MetricSums
    from vime.training.packing import MicroBatch, PackedInputs


@dataclass
class TrainerConfig:
    """Trainer options (model, optimizer, schedule, micro-batching, precision)."""

    hf_checkpoint: str = option("", help="HF model folder the trainer loads (config + weights)")
    backend: Literal["torch", "megatron"] = option("torch", help="trainer implementation")
    lr: float = option(1e-6, help="peak learning rate of AdamW")
    min_lr: float = option(0.0, help="learning rate at the end of a cosine or linear decay")
    lr_warmup_iters: int = option(0, help="steps of linear warmup from 0 to --lr")
    lr_decay_style: Literal["constant", "linear", "cosine"] = option(
        "constant", help="learning-rate schedule after warmup"
    )
    train_iters: int | None = option(
        None, help="total optimizer steps; needed by the linear and cosine schedules"
    )
    weight_decay: float = option(0.0, help="AdamW decoupled weight decay")
    adam_beta1: float = option(0.9, help="AdamW beta1")
    adam_beta2: float = option(0.999, help="AdamW beta2")
    adam_eps: float = option(1e-8, help="AdamW epsilon")
    clip_grad: float = option(1.0, help="clip the global gradient norm to this (0 disables)")
    max_tokens_per_micro_batch: int = option(
        8192, help="token budget of one packed micro-batch (per process)"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", help="parameter dtype; auto means float32 on CPU and bfloat16 on GPU"
    )
    attn_implementation: str = option(
        "packed_sdpa",
        help="torch backend's attention: packed_sdpa runs torch SDPA's causal kernel once per "
        "packed sequence; a transformers implementation (sdpa, eager, flex_attention) attends "
        "over the whole packed micro-batch through a block-causal mask",
    )
    share_prompts: bool | None = option(
        None,
        help="samples of a micro-batch that start with the same prompt (a GRPO group's n "
        "samples) hold it once in the packed row, each completion attending to that one copy, "
        "so the prompt's tokens are computed once forward and backward (same math; the "
        "quickstart's steps pack about a quarter fewer tokens); such samples are planned into "
        "one micro-batch. Unset: on for the torch backend with --attn-implementation "
        "packed_sdpa, off elsewhere (an H100's GRPO steps of a 0.6B model: 1.04x as fast "
        "with 256-token prompts, 1.38x with 2,048; see docs/performance.md); "
        "--share-prompts insists (an error where it cannot apply); --no-share-prompts packs "
        "every sample whole",
    )
    gradient_checkpointing: bool = option(False, help="recompute activations in the backward")
    bf16_weight_copy: bool | None = option(
        None,
        help="torch backend: forward and backward run on a bfloat16 copy of the float32 weights, "
        "refreshed after each optimizer step, and each weight's gradient is added into its "
        "float32 master's as backward finishes it; the whole model then computes in bfloat16 "
        "(residual stream included), as the inference engine, the megatron backend and FSDP2's "
        "bf16 policy do. Unset: on for bfloat16 compute on a GPU in one trainer process, off "
        "elsewhere (the CPU keeps autocast); --bf16-weight-copy insists (an error "
        "where it cannot apply); --no-bf16-weight-copy uses autocast, which casts every weight "
        "per micro-batch and keeps the residual stream in float32",
    )
    hf_rms_norm_fusion: bool = option(
        True,
        help="torch backend: the transformers model's RMSNorm modules (Llama, Qwen2, Qwen3, "
        "Qwen3-MoE, Mistral) run vime's Triton RMSNorm kernels where Triton runs (CUDA), one "
        "kernel each way instead of transformers' float32 elementwise ops (same math)",
    )
    hf_rope_fusion: bool = option(
        True,
        help="torch backend: transformers' apply_rotary_pos_emb (Llama, Qwen2, Qwen3, "
        "Qwen3-MoE, Mistral) rotates the query and the key with one Triton kernel each way "
        "where Triton runs (CUDA) instead of five elementwise ops (same math); process-wide",
    )
    hf_swiglu_fusion: bool = option(
        True,
        help="torch backend: the transformers model's SiLU-gated MLPs (Llama, Qwen2, Qwen3, "
        "Qwen3-MoE, Mistral) compute silu(gate) * up in one Triton kernel each way where Triton "
        "runs (CUDA), keeping only the two projections for backward (same math); with the bf16 "
        "weight copy the gate and up projections are also one matmul on their stacked copies",
    )
    hf_optimizer_fusion: bool = option(
        True,
        help="torch backend, in one trainer process where Triton runs (CUDA): gradient "
        "clipping, AdamW on the float32 weights and the refresh of the bf16 weight copy in one "
        "Triton pass per parameter group (the megatron backend's --optimizer-fusion kernel), "
        "the clipping factor computed and read on the GPU; --no-hf-optimizer-fusion clips with "
        "torch's clip_grad_norm_, steps torch's fused AdamW and refreshes the copy apart (same "
        "math, the same optimizer states)",
    )
    hf_gradient_accumulation_fusion: bool = option(
        True,
        help="torch backend, bf16 weight copy: each linear's weight gradient (the output "
        "layer's aside) is one GEMM adding into its float32 master's gradient, as the megatron "
        "backend's --gradient-accumulation-fusion does; --no-hf-gradient-accumulation-fusion "
        "writes a bf16 gradient that a hook adds into the master (the same sum, with the "
        "gradient rounded to bf16 first where the GEMM accumulates in float32: CUDA)",
    )
    output_softmax_fusion: bool = option(
        True,
        help="the output layer's softmax, sampled-token logprob and entropy as Triton kernels "
        "where they run (CUDA): each chunk of logits is read once forward and once backward; "
        "--no-output-softmax-fusion uses torch's ops (same math, summed in another order)",
    )
    rollout_temperature: float = option(
        1.0, help="sampling temperature of the rollouts; logits are divided by it"
    )
    seed: int = option(1234, help="seed of the trainer's random number generators")
    lora_rank: int = option(0, help="LoRA rank (torch backend); 0 trains all weights")
    lora_alpha: float = option(16.0, help="LoRA alpha; the update is scaled by alpha / rank")
    lora_target_modules: str = option(
        "q_proj,k_proj,v_proj,o_proj",
        help="comma-separated nn.Linear attribute names that get LoRA adapters",
    )

    def __post_init__(self) -> None:
        checks = [
            (self.lr >= 0, "--lr", self.lr, "must be >= 0"),
            (0 <= self.min_lr <= self.lr, "--min-lr", self.min_lr, "must be in [0, --lr]"),
            (self.lr_warmup_iters >= 0, "--lr-warmup-iters", self.lr_warmup_iters, "must be >= 0"),
            (self.weight_decay >= 0, "--weight-decay", self.weight_decay, "must be >= 0"),
            (0 <= self.adam_beta1 < 1, "--adam-beta1", self.adam_beta1, "must be in [0, 1)"),
            (0 <= self.adam_beta2 < 1, "--adam-beta2", self.adam_beta2, "must be in [0, 1)"),
            (self.adam_eps > 0, "--adam-eps", self.adam_eps, "must be > 0"),
            (self.clip_grad >= 0, "--clip-grad", self.clip_grad, "must be >= 0 (0 disables)"),
            (self.lora_rank >= 0, "--lora-rank", self.lora_rank, "must be >= 0 (0 disables)"),
            (
                self.max_tokens_per_micro_batch > 0,
                "--max-tokens-per-micro-batch",
                self.max_tokens_per_micro_batch,
                "must be > 0",
            ),
            (
                self.rollout_temperature > 0,
                "--rollout-temperature",
                self.rollout_temperature,
                "must be > 0",
            ),
        ]
        for ok, flag, value, what in checks:
            if not ok:
                raise ConfigError(f"{flag} {value!r} {what}")
        if self.lora_rank > 0 and self.backend != "torch":
            raise ConfigError(
                f"--lora-rank needs --backend torch; LoRA is not implemented for {self.backend}"
            )
        if self.bf16_weight_copy is True and (self.backend != "torch" or self.dtype == "float32"):
            raise ConfigError(
                "--bf16-weight-copy needs --backend torch and --dtype bfloat16 (or auto on a "
                f"GPU), got --backend {self.backend} --dtype {self.dtype}; the megatron backend "
                "always keeps bf16 weights with float32 masters"
            )
        if self.share_prompts and (
            self.backend != "torch" or self.attn_implementation != "packed_sdpa"
        ):
            raise ConfigError(
                "--share-prompts needs --backend torch and --attn-implementation packed_sdpa, "
                f"got --backend {self.backend} --attn-implementation {self.attn_implementation}; "
                "drop it or pass --no-share-prompts"
            )
        decays = self.lr_decay_style != "constant"
        if decays and (self.train_iters is None or self.train_iters <= self.lr_warmup_iters):
            raise ConfigError(
                f"--lr-decay-style {self.lr_decay_style} needs --train-iters greater than "
                f"--lr-warmup-iters ({self.lr_warmup_iters}), got {self.train_iters!r}"
            )

    def shares_prompts(self) -> bool:
        """Whether micro-batches hold a prompt their samples share once (``--share-prompts``,
        resolved)."""
        if self.share_prompts is not None:
            return self.share_prompts
        return self.backend == "torch" and self.attn_implementation == "packed_sdpa"


class Trainer(abc.ABC):
    """A policy being trained: logprobs, optimizer steps, weight export and checkpoints.

    Every method is collective when the trainer runs in several processes: each rank calls it
    with the same global batch and the step shares it out over the data-parallel ranks.
    ``weight_version`` starts at 0 for the loaded weights and grows by one with every
    optimizer step.

    Gradient contract: each micro-batch's loss carries the step's global normalisers (loss
    tokens and sequences of the whole batch), and a backend's gradient reduction *sums* over
    data-parallel ranks, so accumulation and data parallelism give exactly the gradient of
    one big batch.
    """

    config: TrainerConfig
    loss_config: LossConfig
    model: Any  # what train()/eval() switch; the backend's wrapped module
    schedule: Any  # vime.training.optim.LRSchedule of the optimizer (None without one)
    device: torch.device
    role: str = "actor"  # only the actor trains; a reference only computes logprobs
    rank: int = 0  # this process's rank in the trainer's process group
    world_size: int = 1
    dp_rank: int = 0  # rank among the data-parallel replicas (which share of a batch)
    dp_size: int = 1
    dp_group: Any = None  # process group of the data-parallel replicas (None: the default)
    last_stage: bool = True  # computes the outputs (False before a pipeline's last stage)

    def __init__(self, config: TrainerConfig, loss: LossConfig | None = None) -> None:
        from vime.algorithms.config import LossConfig

        if not config.hf_checkpoint:
            raise ConfigError(
                "--hf-checkpoint is not set; the trainer needs the HF model folder (config and "
                "safetensors weights) it trains"
            )
        self.config = config
        self.loss_config = loss or LossConfig()
        self._weight_version = 0
        self._step_logprobs: dict[int, torch.Tensor] = {}  # of the last train_step
        self._step_size = 0

    @property
    def shares_prompts(self) -> bool:
        """Whether this trainer's micro-batches hold shared prompts once (``--share-prompts``)."""
        return self.config.shares_prompts()

    @property
    def weight_version(self) -> int:
        """Number of optimizer steps applied to the loaded weights (restored by ``load``)."""
        return self._weight_version

    # ---- what a backend supplies -----------------------------------------------------------

    @abc.abstractmethod
    def _token_logprobs_and_entropy(
        self, inputs: PackedInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``t = 0 .. T-2`` of a packed row: ``log p(x[t+1] | x[:t+1])`` under
        ``softmax(logits / config.rollout_temperature)`` and the entropy of that softmax, each
        ``[T - 1]`` float32, over the whole vocabulary (all tensor-parallel shards).

        Backends compute both from the last hidden states and the output layer's weight with
        :func:`~vime.training.output_logprobs.token_logprobs_and_entropy`, so the ``[T, V]``
        float32 logits never exist; the entropy costs backward work only when a loss uses it.
        When ``inputs.scored_rows`` is set, only those rows are computed and the others are 0.0.
        """

    @abc.abstractmethod
    def _zero_grad(self) -> None:
        """Clear the gradients before a step's first backward."""

    @abc.abstractmethod
    def _reduce_gradients(self) -> None:
        """Finish the gradients after the last backward: sum over data-parallel ranks and
        whatever else the parallel layout needs, so every rank holds the full step gradient."""

    @abc.abstractmethod
    def _optimizer_step(self) -> float | torch.Tensor:
        """Clip to ``config.clip_grad`` (0: no clipping), update the weights at the learning
        rate the schedule set, and return the global gradient norm before clipping (a float,
        or a scalar device tensor that train_step reads after queueing the rest)."""

    # ---- the step algorithm ----------------------------------------------------------------

    def _plans(self, batch: TrainBatch) -> list[list[MicroBatch]]:
        """Every data-parallel rank's micro-batches; every rank gets the same number."""
        from vime.training.packing import plan_micro_batches, prompt_units

        budget = self.config.max_tokens_per_micro_batch
        lengths = [s.num_tokens for s in batch]
        units = prompt_units(batch.samples, budget) if self.shares_prompts else None
        return plan_micro_batches(lengths, budget, self.dp_size, units)

    def _plan(self, batch: TrainBatch) -> list[MicroBatch]:
        """This data-parallel rank's micro-batches."""
        return self._plans(batch)[self.dp_rank]

    def _pack(self, samples: list[TrainSample], mb: MicroBatch, **kw: bool) -> PackedInputs:
        from vime.training.packing import pack_inputs

        return pack_inputs(samples, mb, share_prompts=self.shares_prompts, **kw)

    def compute_logprobs(self, batch: TrainBatch) -> list[torch.Tensor]:
        """The current policy's logprobs: one float32 CPU tensor per sample, in batch order.

        Each has the sample's length; entry ``i`` is log p(token_ids[i] | token_ids[:i]) and
        entry 0 is 0.0. Every rank gets the whole list.
        """
        import torch

        if not batch.samples:
            return []
        mine: dict[int, torch.Tensor] = {}
        self.model.eval()
        with torch.no_grad():
            for mb in self._plan(batch):
                # Dummy micro-batches run too: sharded weights are gathered in lockstep.
                inputs = self._pack(batch.samples, mb)
                token_logprobs, _ = self._token_logprobs_and_entropy(inputs)
                logprobs = inputs.unpack(token_logprobs)
                if not mb.dummy and self.last_stage:
                    for i, lp in zip(mb.indices, logprobs, strict=True):
                        mine[i] = lp.float().cpu()
        return self._gathered(mine, len(batch))

    def step_logprobs(self) -> list[torch.Tensor]:
        """Per-token logprobs of the last ``train_step``'s samples under the weights before its
        update (what the loss compared with the rollout's), in batch order, 0.0 outside each
        sample's loss mask; collective like ``compute_logprobs``. Kept from the loss's own
        forward, no extra pass."""
        return self._gathered(dict(self._step_logprobs), self._step_size)

    def _gathered(self, mine: dict[int, torch.Tensor], n: int) -> list[torch.Tensor]:
        """Per-sample tensors in batch order from this rank's share, on every rank."""
        import torch.distributed as dist

        if self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine)
            for part in gathered:
                mine.update(part)
        return [mine[i] for i in range(n)]

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on the whole batch (micro-batched); returns metrics.

        Metrics: ``loss`` (the whole batch's), ``grad_norm`` (before clipping), ``lr``, token
        and micro-batch counts (``num_tokens`` of the samples, ``num_packed_tokens`` of the
        micro-batches, fewer with ``--share-prompts``), ``step_time_s``, ``tokens_per_s``, ``weight_version``, and the
        ``policy/*`` and ``mismatch/*`` metrics of :func:`~vime.algorithms.policy.policy_loss`
        as means over the batch's loss tokens.
        """
        from vime.training.metrics import MetricSums

        if self.role != "actor":
            raise RuntimeError(
                f"this {type(self).__name__} has role {self.role!r} and holds no optimizer; "
                "only the actor trains"
            )
        batch.require_loss_tokens()
        start = time.perf_counter()
        num_tokens, num_seqs = loss_normalisers(batch)
        self.model.train()
        self._zero_grad()
        sums = MetricSums()
        plans = self._plans(batch)
        plan = plans[self.dp_rank]
        self._step_logprobs, self._step_size = {}, len(batch)
        loss_total = self._forward_backward(
            plan, lambda mb: self._micro_batch_loss(batch.samples, mb, num_tokens, num_seqs, sums)
        )
        self._reduce_gradients()
        lr = self.schedule.apply_next()
        grad_norm = self._optimizer_step()
        # After the optimizer's kernels are queued: this copy waits for the GPU, and before them
        # the GPU sat idle while the host launched the optimizer (9-12 ms a step on an H200).
        self._step_logprobs = _to_cpu(self._step_logprobs)
        self.schedule.step()
        self._weight_version += 1
        metrics = sums.reduce(self.dp_size > 1, str(self.device), group=self.dp_group)
        if self.dp_size > 1:
            import torch.distributed as dist

            dist.all_reduce(loss_total, group=self.dp_group)
        elapsed = time.perf_counter() - start
        metrics.update(
            {
                "loss": float(loss_total),
                "grad_norm": float(grad_norm),
                "lr": lr,
                "num_tokens": float(batch.num_tokens),
                "num_loss_tokens": float(num_tokens),
                "num_micro_batches": float(len(plan)),
                # What the micro-batches hold, over all ranks: fewer with shared prompts.
                "num_packed_tokens": float(
                    sum(mb.num_tokens for mbs in plans for mb in mbs if not mb.dummy)
                ),
                "step_time_s": elapsed,
                "tokens_per_s": batch.num_tokens / elapsed,
                "weight_version": float(self._weight_version),
            }
        )
        return metrics

    def _forward_backward(
        self, plan: list[MicroBatch], loss_of: Callable[[MicroBatch], torch.Tensor]
    ) -> torch.Tensor:
        """Forward and backward passes of the micro-batches in ``plan`` (``loss_of(mb)`` runs a
        forward and returns its loss); returns the sum of the losses, a float64 0-d tensor. A
        pipelined backend overrides it to interleave micro-batches across its stages."""
        import torch

        loss_total = torch.zeros((), dtype=torch.float64, device=self.device)
        for mb in plan:
            loss = loss_of(mb)
            loss.backward()
            loss_total += loss.detach()
        return loss_total

    def _micro_batch_loss(
        self,
        samples: list[TrainSample],
        mb: MicroBatch,
        num_tokens: int,
        num_seqs: int,
        sums: MetricSums,
    ) -> torch.Tensor:
        """The micro-batch's share of the step's loss; its metrics are folded into ``sums``."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from vime.algorithms.policy import policy_loss_tensors

        # Only loss-mask rows go through the output layer: prompt and tool tokens need no logits.
        inputs = self._pack(samples, mb, loss_rows_only=True)
        token_logprobs, token_entropy = self._token_logprobs_and_entropy(inputs)
        per_seq = inputs.unpack(token_logprobs)
        if mb.dummy:
            # Runs the same collectives as a real micro-batch and adds no gradient.
            return torch.cat(per_seq).sum() * 0.0
        for i, lp in zip(mb.indices, per_seq, strict=True):
            self._step_logprobs[i] = lp.detach()  # to the CPU once, at the end of the step
        chosen = [samples[i] for i in mb.indices]
        if self.loss_config.entropy_coef <= 0:
            token_entropy = token_entropy.detach()  # only the policy/entropy metric reads it
        entropy = pad_sequence(inputs.unpack(token_entropy), batch_first=True)
        mask = _padded(chosen, "loss_mask", self.device)
        assert mask is not None  # every sample has a loss mask
        # Metrics stay on the device; ``sums`` reads them once, at the end of the step.
        loss, metrics = policy_loss_tensors(
            pad_sequence(per_seq, batch_first=True),
            _padded(chosen, "old_logprobs", self.device),
            _padded(chosen, "advantages", self.device),
            mask,
            self.loss_config,
            rollout_logprobs=_padded(chosen, "rollout_logprobs", self.device),
            ref_logprobs=_padded(chosen, "ref_logprobs", self.device),
            entropy=entropy,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        metrics.pop("policy/loss")  # a share of the step's loss; train_step reports the total
        sums.add(metrics, weight=metrics["policy/num_tokens"])
        return loss

    # ---- weights and checkpoints -----------------------------------------------------------

    @abc.abstractmethod
    def export_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full weights under their HF checkpoint names, in buckets of about ``bucket_bytes``.

        Collective: every rank must exhaust the iterator; rank 0 receives the buckets (full,
        unsharded tensors), the other ranks receive none.
        """

    def export_synced_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The weights a sync to the engines pushes (a subset of :meth:`export_weights` when
        only part of the model trains, e.g. LoRA's merged target layers). Collective."""
        yield from self.export_weights(bucket_bytes)

    @abc.abstractmethod
    def save(self, directory: str | Path) -> Path:
        """Write a checkpoint (model, optimizer, scheduler, RNG, version) atomically."""

    @abc.abstractmethod
    def load(self, directory: str | Path) -> None:
        """Restore everything ``save`` wrote; raises ``CheckpointError`` when it cannot."""

    def save_hf(self, directory: str | Path, *, max_shard_bytes: int = 2 << 30) -> Path:
        """Write the current weights as an HF model folder (collective; rank 0 writes).

        Safetensors shards under the HF names of :meth:`export_weights`, plus the config and
        tokenizer files of ``config.hf_checkpoint``; engines can reload weights from it.
        """
        from vime.training.hf_export import save_hf_checkpoint

        return save_hf_checkpoint(self, directory, max_shard_bytes=max_shard_bytes)

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to free
        """Release processes or memory the backend holds."""


def loss_normalisers(batch: TrainBatch) -> tuple[int, int]:
    """The step's global ``(num_tokens, num_seqs)``: loss tokens, and samples that have one,
    as :func:`~vime.algorithms.losses.count_loss_units` counts them."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    from vime.algorithms.losses import count_loss_units

    return count_loss_units(
        pad_sequence([torch.tensor(s.loss_mask) for s in batch], batch_first=True)
    )


def _to_cpu(tensors: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Float32 CPU copies of per-sample device tensors, in one device-to-host copy."""
    import torch

    if not tensors:
        return {}
    keys = list(tensors)
    flat = torch.cat([tensors[k].float() for k in keys]).cpu()
    parts = flat.split([tensors[k].numel() for k in keys])
    return {k: part.clone() for k, part in zip(keys, parts, strict=True)}  # own storage each


def _padded(samples: list[TrainSample], field: str, device: Any) -> torch.Tensor | None:
    """A ``[B, T]`` float32 tensor of a per-token field, or None when no sample has it."""
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
    return host_to_device(pad_sequence(rows, batch_first=True), device)


def host_to_device(tensor: torch.Tensor, device: Any) -> torch.Tensor:
    """``tensor`` (on the CPU) copied to ``device`` without making the host wait for the GPU.

    torch's blocking copy from pageable memory synchronises the whole stream, so each input
    sent inside a step would wait for all queued kernels; to a CUDA device the copy goes
    through pinned memory, asynchronously (the pinned buffer is kept until the copy is done).
    """
    import torch

    if torch.device(device).type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
