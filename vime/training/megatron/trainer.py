"""The Megatron-core trainer backend: TP/DP, Megatron's (distributed) optimizer, bf16, recompute.

One class serves every role: the actor trains; a ``reference`` (or frozen old policy) holds the
same model without an optimizer and only computes logprobs. Micro-batches are the packed
sequences of :mod:`vime.training.packing`; the loss of each carries the step's global token or
sequence count and Megatron sums gradients over data-parallel ranks, so gradient accumulation
and data parallelism give exactly the gradient of one big batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vime.errors import ConfigError
from vime.training import checkpoint as ckpt
from vime.training.base import Trainer, TrainerConfig
from vime.training.batch import TrainBatch, TrainSample
from vime.training.buckets import DEFAULT_BUCKET_BYTES, bucket_tensors
from vime.training.megatron.arch import GPTArch, arch_from_hf_config
from vime.training.megatron.config import MegatronConfig, Role, parse_megatron_args
from vime.training.megatron.convert import hf_to_megatron, shard, to_hf, tp_split_dim, unshard
from vime.training.metrics import MetricSums
from vime.training.packing import MicroBatch, PackedInputs, pack_inputs, plan_micro_batches

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


def _split_shifted(per_row: torch.Tensor, cu_seqlens: list[int]) -> list[torch.Tensor]:
    """Per-sequence values from values of logits rows (row t scores token t + 1); entry 0 is 0."""
    zero = per_row.new_zeros(1)
    return [torch.cat([zero, per_row[a : b - 1]]) for a, b in itertools.pairwise(cu_seqlens)]


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

        from vime.algorithms.config import LossConfig
        from vime.training.megatron.model import build_gpt_model
        from vime.training.megatron.parallel import init_parallel

        if not config.hf_checkpoint:
            raise ConfigError("MegatronTrainer needs --hf-checkpoint, the HF model folder to train")
        if role not in ("actor", "reference"):
            raise ConfigError(f"role {role!r} is unknown; use 'actor' or 'reference'")
        self.config = config
        self.loss_config = loss or LossConfig()
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
        tp = mcfg.tensor_model_parallel_size
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
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        torch.manual_seed(config.seed)
        self.model = build_gpt_model(self.arch, mcfg, initialize=not load_weights)
        if load_weights:
            self._load_hf_weights()
        self.module: Any = self.model  # the GPTModel itself (unwrapped)
        self.optimizer: Any = None
        self.schedule: Any = None
        if role == "actor":
            self._build_optimizer()
        else:
            self.model.requires_grad_(False)
        self._weight_version = 0

    # ---- construction ----------------------------------------------------------------------

    def _load_hf_weights(self) -> None:
        full = hf_to_megatron(load_hf_state_dict(self.config.hf_checkpoint), self.arch)
        tp = self.mcfg.tensor_model_parallel_size
        params = dict(self.model.named_parameters())
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

    def _build_optimizer(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from vime.training.optim import LRSchedule, lr_at

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
        if torch.cuda.is_available():
            # Without TE/Apex Megatron builds torch's AdamW with its default multi-tensor path;
            # the fused CUDA kernel does the same update in one pass over the fp32 states.
            for part in self._optimizer_parts():
                for group in part.optimizer.param_groups:
                    group.update(fused=True, foreach=False)
        self.schedule = LRSchedule(self.optimizer, c)

    @property
    def weight_version(self) -> int:
        """Optimizer steps applied since the HF weights were loaded."""
        return self._weight_version

    # ---- forward ---------------------------------------------------------------------------

    def _forward(self, inputs: PackedInputs) -> torch.Tensor:
        """Float32 logits ``[T, V / tp]`` of a packed row, divided by the rollout temperature."""
        from megatron.core.packed_seq_params import PackedSeqParams

        packed = None
        cu = inputs.cu_seqlens
        if len(cu) > 2:
            # Several sequences: attention and RoPE restart at each bound (Megatron's thd path).
            bounds = torch.tensor(cu, dtype=torch.int32, device=self.device)
            longest = max(b - a for a, b in itertools.pairwise(cu))
            packed = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=bounds,
                cu_seqlens_kv=bounds,
                max_seqlen_q=longest,
                max_seqlen_kv=longest,
            )
        logits = self.model(
            input_ids=inputs.input_ids.to(self.device),
            position_ids=inputs.position_ids.to(self.device),
            attention_mask=None,
            packed_seq_params=packed,
        )
        logits = logits[0].float()
        if self.config.rollout_temperature != 1.0:
            logits = logits / self.config.rollout_temperature
        return logits

    def _token_logprobs(self, logits: torch.Tensor, inputs: PackedInputs) -> list[torch.Tensor]:
        """Per-sequence logprobs: entry i is log p(x_i | x_<i), entry 0 is 0.0."""
        ids = inputs.input_ids[0].to(self.device)
        if self.mcfg.tensor_model_parallel_size == 1:
            nxt = -F.cross_entropy(logits[:-1], ids[1:], reduction="none")
        else:
            from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

            # It subtracts the row maximum in place: give it its own copy.
            nxt = -vocab_parallel_cross_entropy(logits[:-1].clone(), ids[1:])
        return _split_shifted(nxt, inputs.cu_seqlens)

    def _entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Per-row entropy; over the vocabulary shards (no gradient) when TP > 1."""
        from vime.algorithms.kl import entropy_from_logits

        if self.mcfg.tensor_model_parallel_size == 1:
            return entropy_from_logits(logits)
        with torch.no_grad():
            top = logits.max(-1).values
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.tp_group)
            shifted = logits - top[:, None]
            exp = shifted.exp()
            stats = torch.stack([exp.sum(-1), (exp * shifted).sum(-1)])
            dist.all_reduce(stats, group=self.tp_group)
            return stats[0].log() - stats[1] / stats[0]

    def _plan(self, batch: TrainBatch) -> list[MicroBatch]:
        lengths = [s.num_tokens for s in batch]
        plan = plan_micro_batches(lengths, self.config.max_tokens_per_micro_batch, self.dp_size)
        return plan[self.dp_rank]

    # ---- logprobs --------------------------------------------------------------------------

    def compute_logprobs(self, batch: TrainBatch) -> list[torch.Tensor]:
        """Current-policy logprobs per sample (float32, CPU), identical on every rank."""
        if not batch.samples:
            return []
        mine: dict[int, torch.Tensor] = {}
        self.model.eval()
        with torch.no_grad():
            for mb in self._plan(batch):
                if mb.dummy:
                    continue  # no collective spans data-parallel ranks in a forward pass
                inputs = pack_inputs(batch.samples, mb)
                logprobs = self._token_logprobs(self._forward(inputs), inputs)
                for i, lp in zip(mb.indices, logprobs, strict=True):
                    mine[i] = lp.float().cpu()
        if dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            for part in gathered:
                mine.update(part)
        return [mine[i] for i in range(len(batch))]

    # ---- training --------------------------------------------------------------------------

    def _padded(self, samples: list[TrainSample], field: str) -> torch.Tensor | None:
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
        self, samples: list[TrainSample], mb: MicroBatch, num_tokens: float, num_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        from torch.nn.utils.rnn import pad_sequence

        from vime.algorithms.policy import policy_loss

        inputs = pack_inputs(samples, mb)
        logits = self._forward(inputs)
        per_seq = self._token_logprobs(logits, inputs)
        if mb.dummy:
            return torch.cat(per_seq).sum() * 0.0, {}
        chosen = [samples[i] for i in mb.indices]
        mask = self._padded(chosen, "loss_mask")
        assert mask is not None  # every sample has a loss mask
        entropy = None
        if self.loss_config.entropy_coef > 0:
            entropy = pad_sequence(
                _split_shifted(self._entropy(logits), inputs.cu_seqlens), batch_first=True
            )
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
                for s, a in zip(chosen, inputs.cu_seqlens[:-1], strict=True)
                for j, m in enumerate(s.loss_mask)
                if m
            ]
            metrics["policy/entropy"] = float(self._entropy(logits[rows].detach()).mean())
        metrics.pop("policy/loss")  # a share of the step's loss; train_step reports the total
        return loss, metrics

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step over the batch; see :meth:`Trainer.train_step`."""
        from megatron.core.distributed import finalize_model_grads

        from vime.algorithms.losses import count_loss_units

        if self.optimizer is None:
            raise RuntimeError(
                f"this MegatronTrainer has role {self.role!r} and holds no optimizer; only the "
                "actor trains"
            )
        batch.require_loss_tokens()
        start = time.perf_counter()
        num_tokens, num_seqs = 0, 0
        for s in batch:
            t, q = count_loss_units(torch.tensor(s.loss_mask)[None])
            num_tokens, num_seqs = num_tokens + t, num_seqs + q
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        sums = MetricSums()
        plan = self._plan(batch)
        loss_total = 0.0
        for mb in plan:
            # Gradients are summed over data-parallel ranks, so the global counts normalise.
            loss, metrics = self._micro_batch_loss(batch.samples, mb, num_tokens, num_seqs)
            loss.backward()
            loss_total += float(loss.detach())
            if metrics and self.tp_rank == 0:
                sums.add(metrics, weight=metrics["policy/num_tokens"])
        # Megatron's own finalisation: the data-parallel reduction, and the sum over TP ranks
        # of replicated weights that see only their rank's heads (Qwen3's q/k norms).
        finalize_model_grads([self.model])
        lr = self.schedule.apply_next()
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("the Megatron optimizer skipped the step (non-finite gradients)")
        self.schedule.step()
        self._weight_version += 1
        metrics = sums.reduce(dist.get_world_size() > 1, str(self.device))
        total = torch.tensor([loss_total], dtype=torch.float64, device=self.device)
        if self.dp_size > 1:
            dist.all_reduce(total, group=self.dp_group)
        elapsed = time.perf_counter() - start
        metrics.update(
            {
                "loss": float(total[0]),
                "grad_norm": float(grad_norm),
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

    # ---- weights ---------------------------------------------------------------------------

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Megatron name, full tensor) of every parameter; full on every rank of a TP group."""
        tp = self.mcfg.tensor_model_parallel_size
        for name, param in self.module.named_parameters():
            tensor = param.detach()
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
        # Every rank takes part in gathering TP shards; only rank 0 keeps the result.
        for name, full in self._full_weights():
            if self.rank == 0:
                yield from to_hf(name, full, self.arch)

    # ---- checkpoints -----------------------------------------------------------------------

    def _layout(self) -> dict[str, int]:
        return {
            "world_size": dist.get_world_size(),
            "tensor_model_parallel_size": self.mcfg.tensor_model_parallel_size,
            "use_distributed_optimizer": int(self.mcfg.use_distributed_optimizer),
        }

    def _rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": ckpt.rng_state()}
        if self.dp_rank == 0:
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
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def save(self, directory: str | Path) -> Path:
        """Atomic checkpoint: per-rank model shard, optimizer state and RNG; see :class:`Trainer`.

        It loads back only into the same layout (processes, TP size, optimizer kind).
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
            # Megatron orders ranks TP-fastest: DP replica 0's shard of this TP rank is rank tp_rank.
            mine["model"] = ckpt.load_object(directory / f"rank{self.tp_rank}.pt")["model"]
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
