"""Train-step throughput and MFU of the megatron and torch trainer backends, side by side with
a plain transformers + SDPA training loop on the same sequences (the ``plain`` row, and the
``x plain`` column: each backend's tokens/s over the plain loop's in the same run).

Random-weight Qwen3-shaped models, sequences of ``--seq-len`` tokens, one full ``train_step``
(forward, backward, optimizer) per measurement. MFU counts the matmul FLOPs of a token,
``6 N + 6 L s q`` (N: weights in matmuls, tied embeddings once as the output layer; L layers;
s sequence length; q query width; causal attention), against the bf16 matmul rate measured in
the same run. Each (model, backend) runs in its own process so GPU memory starts empty; the
megatron runs also time ``export_weights`` into pinned CPU memory.

    python bench/train_mfu.py --models qwen3-1.7b,qwen3-4b --backends plain,megatron,torch \
        --seq-len 4096 --out results.json
    python bench/train_mfu.py --models qwen3-moe-16x2 --backends megatron \
        --megatron-args "--use-distributed-optimizer --moe-aux-loss-coeff 0.001"

On the device machine: install the carried wheels into a folder on PYTHONPATH with the
checkout (megatron-core, and what ``import vime`` needs beyond that machine's image: gymnasium,
farama-notifications, pydantic, pydantic-core, annotated-types, typing-inspection and
docstring-parser, each for CPython 3.12), and link envs/, agents/ and sandboxes/ as
vime/envs etc. (the package layout setup.py maps); ``--reference PATH`` runs
``../shared/bench/hf_train_baseline.py`` (carried as an untracked copy) first in the same run,
as the ``reference`` rows and the ``x ref`` column.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


UNFUSED = (
    " --no-bias-swiglu-fusion --no-rope-fusion --no-gradient-accumulation-fusion"
    " --no-rms-norm-fusion --no-optimizer-fusion --no-qk-norm-rope-fusion"
)


# Variant names of the trainer's own fusion options (TrainerConfig fields).
TRAINER_FUSIONS = {
    "no-output-softmax": "output_softmax_fusion",
    "no-hf-rms-norm": "hf_rms_norm_fusion",
    "no-hf-swiglu": "hf_swiglu_fusion",
    "no-hf-rope": "hf_rope_fusion",
    "no-hf-optimizer": "hf_optimizer_fusion",
    "no-hf-gradient-accumulation": "hf_gradient_accumulation_fusion",
}
# Every trainer option a no-NAME variant turns off (``unfused`` turns off the fusions only).
TRAINER_OFF = {"no-share-prompts": "share_prompts", **TRAINER_FUSIONS}


BACKENDS = ("plain", "megatron", "torch")
OPTIONS = frozenset(
    {"cudnn", "flash", "masked", "unfused", "autocast", "profile", "cprofile", "export"}
)
RENAMED = {"weight-copy": "the bf16 weight copy is the torch backend's default on a GPU now; "
           "torch+autocast measures the autocast path"}  # fmt: skip


def check_variants(backends: str) -> list[str]:
    """The comma-separated variants of ``--backends``; an unknown backend or option is refused
    before anything is measured (a misspelt option would otherwise measure the default)."""
    variants = [v for v in backends.split(",") if v]
    for variant in variants or [""]:
        backend, *opts = variant.split("+")
        if {"cudnn", "flash"} <= set(opts):
            raise SystemExit(f"--backends: {variant!r}: cudnn and flash are two attention "
                             "choices; pick one")  # fmt: skip
        if backend not in BACKENDS:
            raise SystemExit(f"--backends: {variant!r} names backend {backend!r}; known: "
                             f"{', '.join(BACKENDS)}")  # fmt: skip
        for opt in opts:
            packed = opt.startswith("pack") and opt[4:].isdigit() and int(opt[4:]) > 0
            if opt in ("autocast", "masked") and backend != "torch":
                raise SystemExit(f"--backends: {variant!r}: {opt} is a torch backend option")
            if opt.startswith("no-") and backend == "torch" and opt not in TRAINER_OFF:
                known = ", ".join(TRAINER_OFF)
                raise SystemExit(f"--backends: {variant!r}: the torch backend's no-NAME options "
                                 f"are {known}")  # fmt: skip
            if opt in OPTIONS or packed or (opt.startswith("no-") and len(opt) > 3):
                continue
            why = RENAMED.get(opt, "see --help for the options")
            raise SystemExit(f"--backends: {variant!r} has an unknown option {opt!r} ({why})")
    return variants


def check_models(models: str) -> list[str]:
    """The comma-separated shapes of ``--models``; an unknown one is refused before anything
    is measured."""
    from qwen3_shapes import shape_fields

    names = [m for m in models.split(",") if m]
    for name in names or [""]:
        try:
            shape_fields(name)
        except ValueError as err:
            raise SystemExit(f"--models: {err}") from None
    return names


def matmul_tflops(n: int = 8192, iters: int = 10) -> float:
    """Dense bf16 ``n x n x n`` matmul rate on random data (mean of ``iters`` after warm-up)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start) / 1e12


def flops_per_token(arch: Any, seq_len: int) -> float:
    """Training FLOPs of one token: ``6 N_matmul + 6 L s q`` (causal attention); for an MoE
    model ``N_matmul`` counts the router and the ``top-k`` experts a token runs through."""
    h, d = arch.hidden_size, arch.head_dim
    q, kv = arch.num_heads * d, arch.num_kv_heads * d
    if arch.is_moe:
        mlp = arch.moe_topk * 3 * h * arch.moe_ffn_hidden_size + h * arch.num_experts
    else:
        mlp = 3 * h * arch.ffn_hidden_size
    per_layer = h * (q + 2 * kv) + q * h + mlp
    n_matmul = arch.num_layers * per_layer + arch.vocab_size * h
    return 6 * n_matmul + 6 * arch.num_layers * seq_len * q


def make_batch(num_samples: int, seq_len: int, vocab: int, prompt: int = 256) -> Any:
    """Random token sequences with a ``prompt``-token unmasked prefix and +-1 advantages."""
    import torch

    from vime.training.batch import TrainBatch, TrainSample

    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(num_samples):
        ids = torch.randint(0, vocab, (seq_len,), generator=g).tolist()
        mask = [0] * prompt + [1] * (seq_len - prompt)
        adv = 1.0 if i % 2 == 0 else -1.0
        samples.append(
            TrainSample(
                token_ids=ids,
                loss_mask=mask,
                advantages=[adv * m for m in mask],
                rollout_logprobs=[-1.0 * m for m in mask],
                sample_id=str(i),
            )
        )
    return TrainBatch(samples)


class PlainLoop:
    """The baseline row: a plain transformers + SDPA supervised step on the same sequences
    (bf16 weights and AdamW moments, fused AdamW, one sequence per micro-batch), the loop an
    RL trainer step should at least match."""

    def __init__(self, model: str) -> None:
        import torch
        from qwen3_shapes import qwen3_config
        from transformers import AutoModelForCausalLM

        with torch.device("cuda"):  # random init on the GPU: minutes faster than on the CPU
            self.model = AutoModelForCausalLM.from_config(
                qwen3_config(model), dtype=torch.bfloat16, attn_implementation="sdpa"
            )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6, fused=True)

    def train_step(self, batch: Any) -> dict[str, float]:
        """Forward with labels, backward, one optimizer step; loss read once at the end."""
        import torch

        losses = []
        for sample in batch:
            ids = torch.tensor([sample.token_ids], device="cuda")
            loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(loss.detach())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": float(torch.stack(losses).mean())}


def build_trainer(
    backend: str,
    model: str,
    folder: Path,
    seq_len: int,
    extra: list[str],
    attn: str = "packed_sdpa",
    trainer_off: tuple[str, ...] = (),
    weight_copy: bool | None = None,
) -> Any:
    """A random-weight trainer of ``backend`` (or the ``plain`` baseline) for ``model``."""
    import torch
    from qwen3_shapes import qwen3_config, write_config_folder

    from vime.training.base import TrainerConfig

    if backend == "plain":
        return PlainLoop(model)

    write_config_folder(model, folder)
    config = TrainerConfig(
        hf_checkpoint=str(folder),
        backend=backend,
        lr=1e-6,
        max_tokens_per_micro_batch=seq_len,
        dtype="bfloat16",
        attn_implementation=attn,
        bf16_weight_copy=weight_copy,
        **dict.fromkeys(trainer_off, False),
    )
    if backend == "megatron":
        from vime.training.megatron.trainer import MegatronTrainer

        return MegatronTrainer(config, megatron_args=["--bf16", *extra], load_weights=False)
    from transformers import AutoModelForCausalLM

    from vime.training.attention import register_hf_attention
    from vime.training.torch_backend import TorchTrainer

    class RandomTorchTrainer(TorchTrainer):
        def _pretrained(self) -> torch.nn.Module:
            register_hf_attention()
            with torch.device(self.device):
                return AutoModelForCausalLM.from_config(
                    qwen3_config(model),
                    dtype=torch.float32,
                    attn_implementation=self.config.attn_implementation,
                )

    return RandomTorchTrainer(config)


def export_rate(trainer: Any) -> dict[str, float]:
    """GB/s of ``export_weights`` copied into pinned CPU buffers: first pass and reuse."""
    import torch

    pinned: dict[str, torch.Tensor] = {}
    out = {}
    for label in ("export_first_pass_gbps", "export_gbps"):
        torch.cuda.synchronize()
        start = time.perf_counter()
        total = 0
        for bucket in trainer.export_weights():
            for name, t in bucket:
                if name not in pinned:
                    pinned[name] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                pinned[name].copy_(t, non_blocking=True)
                total += t.numel() * t.element_size()
        torch.cuda.synchronize()
        out[label] = total / (time.perf_counter() - start) / 1e9
        out["export_gb"] = total / 1e9
    return out


def with_mfu(row: dict[str, Any], rate: float) -> dict[str, Any]:
    """``row`` with its MFU against the measured matmul ``rate`` and against 790 TFLOP/s."""
    row["mfu_measured"] = row["tflops"] / rate
    row["mfu_790"] = row["tflops"] / 790.0
    return row


# The workload the reference script measures (its own constants): every row must match it.
REFERENCE_SEQ_LEN, REFERENCE_SAMPLES = 4096, 2


def reference_rows(script: str, models: list[str], rate: float) -> list[dict[str, Any]]:
    """Run the reference training loop (``../shared/bench/hf_train_baseline.py``) in its own
    process, as the first rows of this run: one ``reference`` row per model of ``models`` it
    measured, or one failed row with its error output."""
    from qwen3_shapes import qwen3_config

    from vime.training.megatron.arch import arch_from_hf_config

    path = Path(script).resolve()
    if not path.is_file():
        raise SystemExit(f"--reference {script}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OUT": tmp}
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                              env=env, cwd=tmp)  # fmt: skip
        print(proc.stdout, end="", flush=True)
        found = Path(tmp) / "hf_train_baseline.json"
        if proc.returncode or not found.is_file():
            error = proc.stderr[-3000:] or f"{path.name} wrote no hf_train_baseline.json"
            print(f"reference FAILED:\n{error}", flush=True)
            return [{"model": m, "backend": "reference", "variant": "reference", "error": error}
                    for m in models]  # fmt: skip
        measured = json.loads(found.read_text())
    rows = []
    for model in models:
        if model not in measured:
            print(f"reference: {path.name} does not measure {model}", flush=True)
            continue
        arch = arch_from_hf_config(qwen3_config(model))
        tps = measured[model]["tokens_per_s"]
        tflops = flops_per_token(arch, REFERENCE_SEQ_LEN) * tps / 1e12
        rows.append(with_mfu({
            "model": model, "backend": "reference", "variant": "reference",
            "params_b": measured[model]["params_b"], "tokens_per_s": tps, "tflops": tflops,
            "peak_gb": measured[model]["peak_gb"], "wall_s": time.perf_counter() - started,
        }, rate))  # fmt: skip
    return rows


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """Measure one (model, backend) in this process."""
    from qwen3_shapes import qwen3_config

    from vime.training.megatron.arch import arch_from_hf_config

    arch = arch_from_hf_config(qwen3_config(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(
            args.backend,
            args.model,
            Path(tmp),
            args.seq_len * args.pack,
            args.megatron_args.split(),
            args.attn,
            tuple(x for x in args.trainer_off.split(",") if x),
            False if args.autocast else None,
        )
    batch = make_batch(args.samples, args.seq_len, arch.vocab_size)
    with attention_backends(args.sdpa):
        result = measure(trainer, batch, arch, args)
    result["variant"] = args.variant
    return result


def attention_backends(choice: str) -> Any:
    """SDPA kernel preference: ``default`` (the trainers' own, torch's order for the plain
    loop), ``cudnn`` first for every length, for the plain loop and the trainers' attention
    alike, or ``flash``: the trainers without their cuDNN path for long sequences."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    from vime.training import attention

    if choice == "default":
        return contextlib.nullcontext()
    if choice == "flash":
        attention.CUDNN_FROM = None
        return contextlib.nullcontext()
    attention.CUDA_SDPA_BACKENDS = attention.cudnn_first()
    return sdpa_kernel(list(attention.CUDA_SDPA_BACKENDS), set_priority=True)


STACK_OPS = {"aten::copy_", "aten::add_", "aten::mul", "aten::cat", "aten::_to_copy", "aten::sum"}


def profile_step(trainer: Any, batch: Any) -> None:
    """Print the GPU kernels of one train step by total time, how busy the GPU was, and the
    torch ops that launched them (device time including children)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        trainer.train_step(batch)
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e6
    print(f"PROFILE wall {wall * 1e3:.0f} ms, kernels {busy * 1e3:.0f} ms", flush=True)
    print(events.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=70))
    ops = [e for e in events if e.key.startswith("aten::") and e.device_time_total > 0]
    ops.sort(key=lambda e: -e.device_time_total)
    for e in ops[:40]:
        print(f"OP {e.key:40} {e.device_time_total / 1e3:9.1f} ms  calls {e.count}")
    # Where the elementwise time comes from: the Python frames that launched the top ops.
    stacked = [e for e in prof.key_averages(group_by_stack_n=6) if e.key in STACK_OPS]
    stacked.sort(key=lambda e: -e.device_time_total)
    for e in stacked[:24]:
        frames = " <- ".join(f for f in e.stack if "torch/" not in f)[:400]
        print(f"STACK {e.key} {e.device_time_total / 1e3:.1f} ms calls {e.count}: {frames}")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        print_gpu_gaps(json.loads(trace.read_text()))


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def print_gpu_gaps(trace: dict[str, Any], top: int = 12) -> None:
    """How long the GPU sat idle within the step, and what the host was doing at the largest
    gaps (the innermost Python frames and any synchronising CUDA call open at the gap's start)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    if not gpu:
        return
    gaps, busy, end = [], 0.0, gpu[0][0]
    for start, stop in gpu:
        if start > end:
            gaps.append((start - end, end))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - gpu[0][0]
    idle = sum(g for g, _ in gaps)
    small = sum(g for g, _ in gaps if g < 20)
    print(
        f"GAPS span {span / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms, idle {idle / 1e3:.1f} ms "
        f"in {len(gaps)} gaps ({small / 1e3:.1f} ms in gaps under 20 us)"
    )
    host = [e for e in events if e.get("cat") in ("python_function", "cuda_runtime", "cpu_op")]
    for gap, at in sorted(gaps, reverse=True)[:top]:
        open_ = [e for e in host if e["ts"] <= at <= e["ts"] + e["dur"]]
        syncs = [e["name"] for e in open_ if e["name"] in SYNC_CALLS]
        frames = [
            e["name"]
            for e in sorted(open_, key=lambda e: -e["ts"])
            if e.get("cat") == "python_function" and "torch/" not in e["name"]
        ][:4]
        print(f"GAP {gap / 1e3:7.2f} ms sync={syncs} at {' <- '.join(frames)[:300]}")
    for name in (*SYNC_CALLS, "cudaMemcpyAsync"):
        calls = [e for e in events if e.get("name") == name]
        if calls:
            total = sum(e["dur"] for e in calls) / 1e3
            print(f"HOST {name}: {len(calls)} calls, {total:.1f} ms")


def measure(trainer: Any, batch: Any, arch: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Median train-step time after warm-up, with throughput, FLOP rate and peak memory."""
    import torch

    for _ in range(args.warmup):
        trainer.train_step(batch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    metrics: dict[str, float] = {}
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        metrics = trainer.train_step(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step = sorted(times)[len(times) // 2]
    tokens = batch.num_tokens
    result = {
        "model": args.model,
        "backend": args.backend,
        "params_b": arch.num_parameters / 1e9,
        "seq_len": args.seq_len,
        "tokens_per_step": tokens,
        "step_s": step,
        "tokens_per_s": tokens / step,
        "tflops": flops_per_token(arch, args.seq_len) * tokens / step / 1e12,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "loss": metrics.get("loss"),
        "grad_norm": metrics.get("grad_norm"),
    }
    if args.backend == "megatron" and args.export:
        result.update(export_rate(trainer))
    if args.profile:
        profile_step(trainer, batch)
    if args.cprofile:
        host_profile(trainer, batch)
    return result


def host_profile(trainer: Any, batch: Any, steps: int = 3) -> None:
    """Where the host's time goes over ``steps`` train steps (cProfile, by own time): the
    step is host-bound when the GPU idles between kernels."""
    import cProfile
    import pstats

    import torch

    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        trainer.train_step(batch)
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(45)


def child_command(args: argparse.Namespace, model: str, variant: str) -> list[str]:
    """The command line of the child process that measures ``variant`` of ``model``."""
    backend, *opts = variant.split("+")
    cmd = [sys.executable, __file__, "--child", "--model", model, "--backend", backend]
    cmd += [f"--variant={variant}"]
    for flag in ("seq_len", "samples", "warmup", "steps"):
        cmd += [f"--{flag.replace('_', '-')}={getattr(args, flag)}"]
    fused = UNFUSED if "unfused" in opts else ""
    # Trainer options (both backends) go to the config; the other no-NAMEs are Megatron
    # flags (--no-NAME-fusion).
    off = [o for o in opts if o.startswith("no-")]
    trainer_off = [TRAINER_OFF[o] for o in off if o in TRAINER_OFF]
    trainer_off += list(TRAINER_FUSIONS.values()) if "unfused" in opts else []
    fused += "".join(f" --{o}-fusion" for o in off if o not in TRAINER_OFF)
    cmd += [f"--megatron-args={args.megatron_args}{fused}"]
    cmd += [f"--trainer-off={','.join(sorted(set(trainer_off)))}"]
    cmd += [f"--sdpa={o}" for o in opts if o in ("cudnn", "flash")]
    cmd += ["--autocast"] if "autocast" in opts else []
    packs = [o.removeprefix("pack") for o in opts if o.startswith("pack")]
    cmd += [f"--pack={packs[0]}"] if packs else []
    cmd += ["--attn=sdpa"] if "masked" in opts else []
    cmd += ["--profile"] if "profile" in opts else []
    cmd += ["--cprofile"] if "cprofile" in opts else []
    cmd += ["--export"] if "export" in opts else []
    return cmd


def main() -> None:
    """Parse flags; as parent, run every (model, backend) child and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--models",
        default="qwen3-1.7b,qwen3-4b",
        help="comma-separated shapes of bench/qwen3_shapes.py; NAME@LAYERS keeps that many of "
        "its layers (qwen3-4b@24 fits the 4B layers' trainers on an 80 GB card)",
    )
    p.add_argument(
        "--backends",
        default="plain,megatron+export,torch",
        help="comma-separated variants: "
        "backend[+cudnn|+flash][+packN][+masked][+unfused][+no-NAME][+autocast][+profile][+cprofile]"
        "[+export]; "
        "backend plain is the baseline (a plain transformers + SDPA bf16 loop) (cudnn: "
        "cuDNN attention first for every length, where the trainers take it only from "
        "vime.training.attention.CUDNN_FROM tokens on; flash: the trainers never take cuDNN; packN: N sequences per micro-batch; masked: the torch backend "
        "with transformers' block-masked sdpa instead of packed_sdpa; unfused: megatron without "
        "its SwiGLU, RoPE, weight-gradient accumulation, RMSNorm, optimizer and query/key "
        "norm + RoPE fusions, which are on by default on CUDA, and either backend without the output softmax kernels; "
        "no-NAME: without one of them (--no-NAME-fusion, e.g. no-rms-norm, no-optimizer, "
        "no-qk-norm-rope, "
        "no-output-softmax, no-hf-rms-norm, no-hf-swiglu, no-hf-rope, no-hf-optimizer and "
        "no-hf-gradient-accumulation for the torch backend; no-share-prompts: the torch backend packs every sample whole, "
        "--no-share-prompts); "
        "autocast: the torch backend with --no-bf16-weight-copy (its default on a GPU is the "
        "bf16 weight copy); export: time export_weights; "
        "profile: print a kernel profile of one step and the GPU's idle gaps; cprofile: print where the host's time goes over three steps)",
    )
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--samples", type=int, default=2, help="sequences per train step")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument(
        "--megatron-args",
        default="",
        help="extra Megatron flags for the megatron rows (default none: the trainer's own "
        "defaults, whose non-distributed optimizer is the one --optimizer-fusion covers)",
    )
    p.add_argument(
        "--reference",
        default="",
        help="path of the reference loop ../shared/bench/hf_train_baseline.py: run it first, in "
        "its own process, as the reference rows and the x ref column (needs --seq-len 4096 "
        "--samples 2, its workload)",
    )
    p.add_argument("--out", default="")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="", help=argparse.SUPPRESS)
    p.add_argument("--sdpa", default="default", help=argparse.SUPPRESS)
    p.add_argument("--pack", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--attn", default="packed_sdpa", help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cprofile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trainer-off", default="", help=argparse.SUPPRESS)
    p.add_argument("--export", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run_child(args)), flush=True)
        return
    if args.reference and (args.seq_len, args.samples) != (REFERENCE_SEQ_LEN, REFERENCE_SAMPLES):
        raise SystemExit(
            f"--reference measures {REFERENCE_SAMPLES} sequences of {REFERENCE_SEQ_LEN} tokens a "
            f"step; this run asks for {args.samples} of {args.seq_len} (drop --reference, or "
            f"use --seq-len {REFERENCE_SEQ_LEN} --samples {REFERENCE_SAMPLES})"
        )
    variants = check_variants(args.backends)
    models = check_models(args.models)
    rate = matmul_tflops()
    print(f"bf16 matmul 8192^3: {rate:.0f} TFLOP/s (reference 790)", flush=True)
    rows = reference_rows(args.reference, models, rate) if args.reference else []
    for model in models:
        for variant in variants:
            cmd = child_command(args, model, variant)
            started = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            print("\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("RESULT")))
            if proc.returncode or not found:
                row = {"model": model, "backend": variant, "error": proc.stderr[-3000:]}
                print(f"{model} {variant} FAILED:\n{proc.stderr[-3000:]}", flush=True)
            else:
                row = with_mfu(json.loads(found[-1][len("RESULT ") :]), rate)
                print(f"{model} {variant}: {json.dumps(row)}", flush=True)
            row["wall_s"] = time.perf_counter() - started
            rows.append(row)
    for key, backend in (("vs_plain", "plain"), ("vs_reference", "reference")):
        base = {r["model"]: r for r in rows if r.get("backend") == backend and "error" not in r}
        for r in rows:
            if "error" not in r and r["model"] in base:
                r[key] = r["tokens_per_s"] / base[r["model"]]["tokens_per_s"]
    print(
        f"\n{'model':14} {'variant':16} {'tok/s':>8} {'TFLOP/s':>8} {'MFU@790':>8} "
        f"{'MFU@meas':>8} {'peak GB':>8} {'x plain':>8} {'x ref':>8} {'export GB/s':>11}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['model']:14} {r['backend']:16} failed")
            continue
        exp = f"{r['export_gbps']:.1f}" if "export_gbps" in r else "-"
        ratio = f"{r['vs_plain']:.2f}x" if "vs_plain" in r else "-"
        ref = f"{r['vs_reference']:.2f}x" if "vs_reference" in r else "-"
        print(
            f"{r['model']:14} {r['variant']:16} {r['tokens_per_s']:8.0f} {r['tflops']:8.0f} "
            f"{r['mfu_790']:8.1%} {r['mfu_measured']:8.1%} {r['peak_gb']:8.1f} {ratio:>8} "
            f"{ref:>8} {exp:>11}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"matmul_tflops": rate, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
