"""The Megatron-core trainer backend: TP/DP, Megatron's (distributed) optimizer, bf16, recompute.

One class serves every role: the actor trains; a ``reference`` (or frozen old policy) holds the
same model without an optimizer and only computes logprobs. The training step is
:class:`~vime.training.base.Trainer`'s; this backend supplies the (vocab-parallel) forward pass,
token logprobs and entropy, and Megatron's gradient finalisation and optimizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vime.errors import ConfigError
from vime.training import checkpoint as ckpt
from vime.training.base import Trainer, TrainerConfig, host_to_device
from vime.training.buckets import DEFAULT_BUCKET_BYTES, bucket_tensors
from vime.training.megatron.arch import GPTArch, arch_from_hf_config
from vime.training.megatron.config import MegatronConfig, Role, parse_megatron_args
from vime.training.megatron.convert import (
    expert_to_global,
    hf_to_megatron,
    is_expert,
    shard,
    to_hf,
    tp_split_dim,
    unshard,
)
from vime.training.megatron.fused_optimizer import check_supported, fused_step, optimizer_parts
from vime.training.megatron.pipeline import PipelineStage, to_global_layer
from vime.training.packing import PackedInputs

if TYPE_CHECKING:
    from vime.algorithms.config import LossConfig


def load_hf_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF model folder's ``*.safetensors`` files, on CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {str(folder)!r}; is it an HF model?")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    return state


def _param_state(optimizer: Any) -> dict[Any, Any]:
    """A distributed optimizer's per-rank fp32 params and moments, in its bucket layout.

    megatron-core 0.16's loader skips entries flagged ``padding`` but its getter sets no flag;
    every entry the getter returns is a real parameter, so it is flagged ``False`` here.
    """
    state = optimizer.get_parameter_state_dp_reshardable()
    for key, per_dtype in state.items():
        if isinstance(key, int):
            for buckets in per_dtype.values():
                for bucket in buckets:
                    for entry in bucket:
                        entry.setdefault("padding", False)
    return state


class MegatronTrainer(Trainer):
    """Trainer backend on megatron-core; see :class:`~vime.training.base.Trainer`.

    ``megatron_args`` are Megatron's own flags (parsed by :func:`parse_megatron_args`), or give
    a parsed ``megatron`` config. ``role="reference"`` builds no optimizer. ``load_weights=False``
    keeps Megatron's random initialisation (benchmarks; only the HF ``config.json`` is read).
    """

    def __init__(
        self,
        config: TrainerConfig,
        loss: LossConfig | None = None,
        megatron_args: Sequence[str] = (),
        *,
        megatron: MegatronConfig | None = None,
        role: Role = "actor",
        load_weights: bool = True,
    ) -> None:
        from transformers import AutoConfig

        from vime.training.megatron.model import build_gpt_model
        from vime.training.megatron.parallel import init_parallel

        super().__init__(config, loss)
        if role not in ("actor", "reference"):
            raise ConfigError(f"role {role!r} is unknown; use 'actor' or 'reference'")
        self.role = role
        mcfg = megatron or parse_megatron_args(megatron_args)
        wants_bf16 = config.dtype == "bfloat16" or (
            config.dtype == "auto" and torch.cuda.is_available()
        )
        if mcfg.bf16 and config.dtype == "float32":
            raise ConfigError("--bf16 contradicts --dtype float32; drop one of them")
        if wants_bf16 and not mcfg.bf16:
            mcfg = MegatronConfig(**{**mcfg.__dict__, "bf16": True})
        self.mcfg = mcfg
        self.arch: GPTArch = arch_from_hf_config(AutoConfig.from_pretrained(config.hf_checkpoint))
        self.arch.check_tensor_parallel(mcfg.tensor_model_parallel_size)
        self.arch.check_expert_parallel(mcfg.expert_model_parallel_size)
        tp = mcfg.tensor_model_parallel_size
        if tp > 1 and self.arch.is_moe:
            raise ConfigError(
                f"--tensor-model-parallel-size {tp} with a mixture-of-experts model is not "
                "supported by the Megatron backend yet; split the experts with "
                "--expert-model-parallel-size instead"
            )
        pp = mcfg.pipeline_model_parallel_size
        if pp > 1 and self.arch.is_moe:
            raise ConfigError(
                f"--pipeline-model-parallel-size {pp} with a mixture-of-experts model is not "
                "supported by the Megatron backend yet; use --expert-model-parallel-size"
            )
        if self.arch.num_layers % pp:
            raise ConfigError(
                f"--pipeline-model-parallel-size {pp} must divide the model's "
                f"{self.arch.num_layers} layers (each stage holds an equal share)"
            )
        if tp > 1 and self.loss_config.entropy_coef > 0:
            raise ConfigError(
                f"--entropy-coef {self.loss_config.entropy_coef} needs the full-vocabulary "
                "entropy, which the Megatron backend computes only at --tensor-model-parallel-size 1"
            )
        init_parallel(mcfg, config.seed)
        from megatron.core import parallel_state as mpu

        self.tp_group = mpu.get_tensor_model_parallel_group()
        self.tp_rank = mpu.get_tensor_model_parallel_rank()
        self.dp_group = mpu.get_data_parallel_group()
        self.dp_rank = mpu.get_data_parallel_rank()
        self.dp_size = mpu.get_data_parallel_world_size()
        self.ep_group = mpu.get_expert_model_parallel_group() if self.arch.is_moe else None
        self.ep_rank = mpu.get_expert_model_parallel_rank() if self.arch.is_moe else 0
        self.ep_size = mcfg.expert_model_parallel_size
        self.experts_per_rank = self.arch.num_experts // self.ep_size
        self._step_tokens = 1  # tokens of the running train_step's batch (MoE aux loss scale)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        torch.manual_seed(config.seed)
        self.model = build_gpt_model(self.arch, mcfg, initialize=not load_weights)
        self.stage = PipelineStage.current(self.model.config)
        self.last_stage = self.stage.last
        if load_weights:
            self._load_hf_weights()
        self.module: Any = self.model  # the GPTModel itself (unwrapped)
        self.optimizer: Any = None
        self.schedule: Any = None
        if role == "actor":
            self._build_optimizer()
        else:
            self.model.requires_grad_(False)

    # ---- construction ----------------------------------------------------------------------

    def _load_hf_weights(self) -> None:
        full = hf_to_megatron(load_hf_state_dict(self.config.hf_checkpoint), self.arch)
        tp = self.mcfg.tensor_model_parallel_size
        params = {self._global_name(n): p for n, p in self.model.named_parameters()}
        missing = sorted(set(params) - set(full))
        if missing:
            raise RuntimeError(f"the converted weights lack Megatron parameters {missing[:3]}")
        with torch.no_grad():
            for name, param in params.items():
                piece = shard(name, full[name], tp, self.tp_rank)
                if piece.shape != param.shape:
                    raise RuntimeError(
                        f"{name}: converted shape {tuple(piece.shape)} != model shape "
                        f"{tuple(param.shape)}"
                    )
                param.copy_(piece)

    def _global_name(self, name: str) -> str:
        """A parameter's name in the full state dict: its expert's global index under EP, its
        layer's global index under PP; a later stage's copy of tied embeddings is the word
        embedding."""
        if name == "output_layer.weight" and self.arch.tied_embeddings:
            return "embedding.word_embeddings.weight"
        name = expert_to_global(name, self.ep_rank, self.experts_per_rank)
        return to_global_layer(name, self.stage.offset)

    def _build_optimizer(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from vime.training.megatron import multi_tensor
        from vime.training.optim import LRSchedule, lr_at

        multi_tensor.install()  # no host sync per parameter in the grad norm and clipping
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=self.mcfg.overlap_grad_reduce,
            use_distributed_optimizer=self.mcfg.use_distributed_optimizer,
        )
        self.model = DistributedDataParallel(self.model.config, ddp_config, self.model)
        c = self.config
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=lr_at(1, c),
            min_lr=c.min_lr,
            weight_decay=c.weight_decay,
            adam_beta1=c.adam_beta1,
            adam_beta2=c.adam_beta2,
            adam_eps=c.adam_eps,
            clip_grad=c.clip_grad,
            bf16=self.mcfg.bf16,
            params_dtype=torch.bfloat16 if self.mcfg.bf16 else torch.float32,
            use_distributed_optimizer=self.mcfg.use_distributed_optimizer,
        )
        self.optimizer = get_megatron_optimizer(opt_config, [self.model])
        self._fused_optimizer = self.mcfg.fused("optimizer")
        if self._fused_optimizer:
            try:
                check_supported(self.optimizer)
            except TypeError as exc:
                if self.mcfg.optimizer_fusion:  # asked for, not the CUDA default
                    raise ConfigError(f"--optimizer-fusion: {exc}; drop the flag") from exc
                self._fused_optimizer = False
        if not self._fused_optimizer and torch.cuda.is_available():
            # Without TE/Apex Megatron builds torch's AdamW with its default multi-tensor path;
            # the fused CUDA kernel does the same update in one pass over the fp32 states.
            for part in self._optimizer_parts():
                for group in part.optimizer.param_groups:
                    group.update(fused=True, foreach=False)
        self.schedule = LRSchedule(self.optimizer, c)

    # ---- forward ---------------------------------------------------------------------------

    def _token_logprobs_and_entropy(
        self, inputs: PackedInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's last (normalised) hidden states and the output weight (this rank's
        vocabulary shard) through the chunked, vocab-parallel kernel: no ``[T, V]`` logits."""
        from megatron.core.packed_seq_params import PackedSeqParams

        from vime.training.output_logprobs import token_logprobs_and_entropy

        packed = None
        cu = inputs.cu_seqlens
        if len(cu) > 2:
            # Several sequences: attention and RoPE restart at each bound (Megatron's thd path).
            bounds = host_to_device(torch.tensor(cu, dtype=torch.int32), self.device)
            longest = max(b - a for a, b in itertools.pairwise(cu))
            packed = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=bounds,
                cu_seqlens_kv=bounds,
                max_seqlen_q=longest,
                max_seqlen_kv=longest,
            )
            packed.vime_host_bounds = list(cu)  # SDPAttention splits on the host
        gpt = self.module
        if not self.stage.first:
            shape = (inputs.input_ids.shape[1], 1, self.arch.hidden_size)
            dtype = gpt.config.params_dtype
            gpt.set_input_tensor(self.stage.receive_hidden(shape, dtype, self.device))
        # Without post_process GPTModel returns the decoder's hidden states [s, b, h] (after the
        # final norm) instead of running its output layer.
        gpt.post_process = False
        try:
            hidden = self.model(
                input_ids=host_to_device(inputs.input_ids, self.device),
                position_ids=host_to_device(inputs.position_ids, self.device),
                attention_mask=None,
                packed_seq_params=packed,
            )
        finally:
            gpt.post_process = True
        if not self.stage.last:
            # The last stage computes the outputs; this one passes its hidden states on.
            self.stage.send_hidden(hidden)
            self._stage_output = hidden
            none = torch.zeros(hidden.shape[0] - 1, device=self.device)
            return none, none
        if gpt.share_embeddings_and_output_weights:
            weight = gpt.shared_embedding_or_output_weight()
        else:
            weight = gpt.output_layer.weight
        tp = self.mcfg.tensor_model_parallel_size
        return token_logprobs_and_entropy(
            hidden[:-1, 0],
            weight,
            host_to_device(inputs.input_ids[0, 1:], self.device),
            temperature=self.config.rollout_temperature,
            group=self.tp_group if tp > 1 else None,
            vocab_start=self.tp_rank * weight.shape[0],
            rows=None
            if inputs.scored_rows is None
            else host_to_device(inputs.scored_rows, self.device),
            fused=self.config.output_softmax_fusion,
        )

    # ---- the MoE auxiliary loss ------------------------------------------------------------

    def train_step(self, batch: Any) -> dict[str, float]:
        """See :meth:`Trainer.train_step`; MoE models add ``--moe-aux-loss-coeff`` times the
        routers' load-balancing loss (:meth:`_micro_batch_loss` says how it is weighted)."""
        self._step_tokens = max(batch.num_tokens, 1)
        metrics = super().train_step(batch)
        # Loss and policy metrics exist on the last pipeline stage only.
        return self.stage.from_last(metrics)

    def _micro_batch_loss(self, samples: Any, mb: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The base micro-batch loss; for an MoE model, also sets the weight of the load-balancing
        loss its routers attach to this forward pass.

        Each MoE layer's router adds ``coeff * aux * T_mb`` to the gradient (megatron-core's
        per-token-loss convention, ``T_mb`` the micro-batch's tokens) times the autoscaler's
        scale. A scale of ``1 / T_step`` (the whole batch's tokens, over every data-parallel
        rank) makes the step's objective ``policy loss + coeff * sum over layers and
        micro-batches of (T_mb / T_step) * aux``: the token-weighted mean of the per-micro-batch
        losses, like the policy loss's global normaliser, and independent of how the batch is
        split over micro-batches and ranks when each micro-batch is one sequence. A dummy
        micro-batch adds none.

        Before a pipeline's last stage it returns the stage's output hidden states instead of a
        loss (see :meth:`_forward_backward`).
        """
        if self.arch.is_moe and self.mcfg.moe_aux_loss_coeff > 0:
            from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

            scale = 0.0 if mb.dummy else 1.0 / self._step_tokens
            # A fill kernel, not a host-to-device copy (which would wait for the stream).
            MoEAuxLossAutoScaler.set_loss_scale(torch.full((), scale, device=self.device))
        if not self.stage.last:
            from vime.training.packing import pack_inputs

            # Before the last stage: the stage's output, whose gradient the next stage sends.
            self._token_logprobs_and_entropy(pack_inputs(samples, mb))
            return self._stage_output
        return super()._micro_batch_loss(samples, mb, *args, **kwargs)

    def _forward_backward(
        self, plan: list[Any], loss_of: Callable[[Any], torch.Tensor]
    ) -> torch.Tensor:
        """See :meth:`Trainer._forward_backward`; pipeline stages run the micro-batches in the
        1F1B schedule (:meth:`PipelineStage.run_1f1b`). The loss total exists on the last stage
        only (zero elsewhere; :meth:`train_step` takes its metrics from there)."""
        if self.stage.size == 1:
            return super()._forward_backward(plan, loss_of)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for loss in self.stage.run_1f1b(plan, loss_of):
            total += loss
        return total

    def compute_logprobs(self, batch: Any) -> list[torch.Tensor]:
        """See :meth:`Trainer.compute_logprobs`; a pipeline stage's sends finish before it returns."""
        logprobs = super().compute_logprobs(batch)
        self.stage.wait_sends()
        return logprobs

    # ---- gradients and the optimizer -------------------------------------------------------

    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _reduce_gradients(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        # Megatron's own finalisation: the data-parallel reduction, and the sum over TP ranks
        # of replicated weights that see only their rank's heads (Qwen3's q/k norms).
        finalize_model_grads([self.model])

    def _optimizer_step(self) -> float | torch.Tensor:
        if self._fused_optimizer:  # the norm stays on the device: train_step reads it last
            ok, grad_norm = fused_step(self.optimizer)
        else:
            ok, grad_norm, _ = self.optimizer.step()  # clips to --clip-grad itself
        if not ok:
            raise RuntimeError("the Megatron optimizer skipped the step (non-finite gradients)")
        return grad_norm

    # ---- weights ---------------------------------------------------------------------------

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Megatron name, full tensor) of this pipeline stage's parameters under their full
        model names; full on every rank of a TP group."""
        tp = self.mcfg.tensor_model_parallel_size
        for local, param in self.module.named_parameters():
            if local == "output_layer.weight" and self.arch.tied_embeddings:
                continue  # the last stage's copy of the first stage's word embedding
            name = to_global_layer(local, self.stage.offset)
            tensor = param.detach()
            if self.ep_size > 1 and is_expert(name):
                # Each expert-parallel rank holds other experts under the same local names.
                pieces = [torch.empty_like(tensor) for _ in range(self.ep_size)]
                dist.all_gather(pieces, tensor.contiguous(), group=self.ep_group)
                for ep_rank, piece in enumerate(pieces):
                    yield expert_to_global(name, ep_rank, self.experts_per_rank), piece
                continue
            if tp > 1 and tp_split_dim(name) is not None:
                pieces = [torch.empty_like(tensor) for _ in range(tp)]
                dist.all_gather(pieces, tensor.contiguous(), group=self.tp_group)
                tensor = unshard(name, pieces)
            yield name, tensor

    def export_weights(
        self, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full tensors under HF names in buckets, on rank 0; see :meth:`Trainer.export_weights`.

        Tensors stay on the trainer's device; unsplit ones alias the live parameters, so copy
        them to keep them past the next ``train_step``.
        """
        yield from bucket_tensors(self._rank0_hf_weights(), bucket_bytes)

    def _rank0_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        # Every rank takes part in gathering TP shards and pipeline stages; only rank 0 keeps
        # the result.
        weights = self._full_weights()
        if self.stage.size > 1:
            weights = self.stage.gather_to_first(weights, self.tp_rank == 0 and self.dp_rank == 0)
        for name, full in weights:
            if self.rank == 0:
                yield from to_hf(name, full, self.arch)

    # ---- checkpoints -----------------------------------------------------------------------

    def _layout(self) -> dict[str, int]:
        layout = {
            "world_size": dist.get_world_size(),
            "tensor_model_parallel_size": self.mcfg.tensor_model_parallel_size,
            "use_distributed_optimizer": int(self.mcfg.use_distributed_optimizer),
        }
        if self.ep_size > 1:
            layout["expert_model_parallel_size"] = self.ep_size
        if self.stage.size > 1:
            layout["pipeline_model_parallel_size"] = self.stage.size
        return layout

    def _rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": ckpt.rng_state()}
        if self.dp_rank == 0 or self.ep_size > 1:
            # Under expert parallelism data-parallel ranks hold different experts.
            state["model"] = {
                k: v.cpu() if isinstance(v, torch.Tensor) else v
                for k, v in self.module.state_dict().items()
            }
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
            if self.mcfg.use_distributed_optimizer and self._weight_version > 0:
                # The distributed optimizer keeps its fp32 params and moments outside state_dict.
                state["param_state"] = [_param_state(part) for part in self._optimizer_parts()]
        return state

    def _optimizer_parts(self) -> list[Any]:
        """The optimizers a Megatron ``ChainedOptimizer`` holds (or the optimizer itself)."""
        return optimizer_parts(self.optimizer)

    def save(self, directory: str | Path) -> Path:
        """Atomic checkpoint: per-rank model shard, optimizer state and RNG; see :class:`Trainer`.

        It loads back only into the same layout (processes, TP and PP sizes, optimizer kind).
        """
        state = {
            "weight_version": self._weight_version,
            "schedule": None if self.schedule is None else self.schedule.state_dict(),
            "layout": self._layout(),
            "role": self.role,
            "hf_checkpoint": self.config.hf_checkpoint,
        }
        return ckpt.save_distributed(
            directory,
            rank=self.rank,
            barrier=dist.barrier,
            write_rank=lambda tmp: ckpt.save_object(
                self._rank_state(), tmp / f"rank{self.rank}.pt"
            ),
            trainer_state=state,
            backend="megatron",
        )

    def load(self, directory: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save` with the same layout."""
        directory = Path(directory)
        state = ckpt.read_trainer_state(directory, "megatron")
        if state["layout"] != self._layout():
            raise ckpt.CheckpointError(
                f"checkpoint layout {state['layout']} differs from this trainer's "
                f"{self._layout()}; load it with the same processes and Megatron flags"
            )
        mine = ckpt.load_object(directory / f"rank{self.rank}.pt")
        if "model" not in mine:
            # Data-parallel replica 0 of this rank's TP rank and pipeline stage saved it.
            first = dist.get_process_group_ranks(self.dp_group)[0]
            mine["model"] = ckpt.load_object(directory / f"rank{first}.pt")["model"]
        self.module.load_state_dict(mine["model"])
        if self.optimizer is not None:
            if "optimizer" not in mine:
                raise ckpt.CheckpointError(f"{str(directory)!r} holds no optimizer state")
            self.optimizer.load_state_dict(mine["optimizer"])
            for part in self._optimizer_parts():
                # megatron-core 0.16 gives every parameter the same ``step`` tensor on load;
                # torch's AdamW then increments it once per parameter, corrupting the bias
                # correction. Each parameter gets its own copy.
                for param_state in part.optimizer.state.values():
                    if isinstance(param_state.get("step"), torch.Tensor):
                        param_state["step"] = param_state["step"].clone()
            for part, param_state in zip(
                self._optimizer_parts(), mine.get("param_state", []), strict=False
            ):
                part.load_parameter_state_from_dp_reshardable(param_state)
            if state["schedule"] is not None:
                self.schedule.load_state_dict(state["schedule"])
        self._weight_version = int(state["weight_version"])
        ckpt.set_rng_state(mine["rng"])
        dist.barrier()
