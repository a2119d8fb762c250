"""``run_training``: the Python API behind ``vime train``."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.orchestration.cluster import Cluster, detect_device
from vime.orchestration.loop import RLLoop, chat_renderer
from vime.orchestration.metrics_log import MetricsLogger
from vime.orchestration.placement import plan_placement
from vime.orchestration.ray_cluster import RayConfig, ray_cluster
from vime.orchestration.setup import TrainSetup
from vime.orchestration.summary import run_summary
from vime.orchestration.tasks import eval_tasks_for, train_tasks_for

log = logging.getLogger(__name__)


def resolve_model(model: str) -> str:
    """A model folder path; ``smollm2`` is the bundled SmolLM2-135M-Instruct."""
    if model == "smollm2":
        from vime.models.smollm2 import smollm2_path

        return str(smollm2_path())
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"--model {model}: not an HF model folder (no config.json); give a folder, or "
            "'smollm2' for the bundled SmolLM2-135M-Instruct"
        )
    return str(path.resolve())


def _check_env_id(env_id: str) -> None:
    """Fail on an unknown env id (with the closest ids) without building the env."""
    import gymnasium

    import vime.envs  # noqa: F401 - registers the built-in envs
    from vime.envs.registry import make

    if env_id not in gymnasium.registry:
        make(env_id)  # raises EnvError listing the closest registered ids


def describe(setup: TrainSetup, device: str) -> str:
    """The dry-run report: configs and placement plan."""
    plan = plan_placement(setup.placement(device))
    lines = [
        f"device: {device}",
        f"mode: {setup.run.mode}"
        + (f" (max staleness {setup.run.max_staleness})" if setup.run.mode == "async" else ""),
        f"placement: {'colocated' if setup.run.colocate else 'disaggregated'}",
        f"env: {setup.rollout.env_id}, {setup.run.rollout_batch_size} tasks x {setup.rollout.n} "
        f"samples per step, {setup.run.num_steps} steps",
        f"trainer: {setup.trainer.backend} backend, lr {setup.trainer.lr}, "
        f"{setup.run.trainer_num_processes} process(es)",
        f"loss: {_describe_loss(setup.loss)}, advantages: {setup.advantage.advantage_estimator}",
        f"engines: {setup.serve.rollout_num_engines} x TP {setup.serve.rollout_num_gpus_per_engine}"
        + (f", vLLM flags {' '.join(setup.serve.vllm_args)}" if setup.serve.vllm_args else "")
        + (
            f", router flags {' '.join(setup.serve.router_args)}" if setup.serve.router_args else ""
        ),
    ]
    if setup.megatron_args:
        lines.append(f"megatron flags: {' '.join(setup.megatron_args)}")
    lines.append(plan.describe())
    return "\n".join(lines)


def _describe_loss(loss: Any) -> str:
    """The loss with the defaults in effect (clip ranges, aggregation, TIS)."""
    text = f"{loss.policy_loss} (clip {loss.clip_low:g}/{loss.clip_high:g}"
    if loss.eps_clip_c is not None:
        text += f", dual clip {loss.eps_clip_c:g}"
    text += f", {loss.loss_agg_mode}"
    if loss.tis_cap is not None:
        text += f", TIS cap {loss.tis_cap:g}"
    return text + ")"


class _Progress:
    """One line per step with phase times and an ETA."""

    def __init__(self, total: int, start_step: int) -> None:
        self.total = total
        self.start_step = start_step
        self.started = time.monotonic()

    def __call__(self, step: int, m: dict[str, Any]) -> None:
        done = step - self.start_step
        per_step = (time.monotonic() - self.started) / max(done, 1)
        eta = per_step * (self.total - step)
        reward = m.get("rollout/reward_mean", float("nan"))
        print(
            f"step {step}/{self.total} | reward {reward:.3f} | rollout {m.get('time/rollout_s', 0):.1f}s "
            f"train {m.get('time/train_s', 0):.1f}s sync {m.get('time/sync_s', 0):.1f}s | "
            f"ETA {eta / 60:.1f} min",
            flush=True,
        )


def _warn_of_emulated_bf16(setup: TrainSetup, device: str) -> None:
    """bf16 asked of a CPU that only emulates it: the run works, two orders of magnitude slower."""
    from vime.config.passthrough import flag_value
    from vime.hardware import cpu_has_native_bf16

    asked = [
        name
        for name, value in (
            ("--dtype", setup.trainer.dtype),
            ("--vllm-dtype", flag_value(setup.serve.vllm_args, "--dtype")),
        )
        if value == "bfloat16"
    ]
    if device == "CPU" and asked and not cpu_has_native_bf16():
        log.warning(
            "%s bfloat16 on a CPU without a native bf16 matmul (AVX-512 BF16 or AMX): torch and "
            "vLLM emulate it here, about 100x slower than float32; pass float32",
            " and ".join(asked),
        )


def run_training(setup: TrainSetup) -> dict[str, Any]:
    """Run (or, with ``--dry-run``, only validate and describe) an RL training run."""
    device = detect_device() if setup.run.device == "auto" else setup.run.device.upper()
    _warn_of_emulated_bf16(setup, device)
    if setup.run.dry_run:
        _check_env_id(setup.rollout.env_id)
        print(describe(setup, device))
        return {"dry_run": True}
    setup = setup.with_model(resolve_model(setup.run.model))
    out = Path(setup.run.output_dir)
    if not setup.run.resume and (out / "checkpoints" / "latest").exists():
        raise ConfigError(
            f"--output-dir {out} already holds a run; pass --resume to continue it or choose "
            "another --output-dir"
        )
    # Bad task files fail here, before minutes are spent starting engines.
    tasks = train_tasks_for(setup)
    eval_tasks = eval_tasks_for(setup) if setup.run.eval_interval else []
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(_config_dict(setup), indent=2, default=str))
    logger = MetricsLogger(out, wandb_project=setup.run.wandb_project)
    print(describe(setup, device), flush=True)
    with ray_cluster(RayConfig(address=setup.run.ray_address)):
        cluster = Cluster(setup, device)
        try:
            t = time.monotonic()
            # The driver's own tokenizer (transformers' import, tokenizer.json) loads while
            # the engines start: after them it held up the quickstart's first rollouts 4-5 s.
            renderer = cluster.start(meanwhile=lambda: chat_renderer(setup.run.model))
            print(
                f"trainer and engines ready in {time.monotonic() - t:.0f}s; router {cluster.base_url}",
                flush=True,
            )
            print(cluster.nodes_line, flush=True)
            loop = RLLoop(setup, cluster, logger, tasks, eval_tasks, renderer)
            if setup.run.resume and not loop.restore():
                print("--resume: no checkpoint yet, starting from step 0")
            progress = _Progress(setup.run.num_steps, loop.state.step)
            runner = loop.run_async if setup.run.mode == "async" else loop.run_sync
            asyncio.run(runner(progress))
        finally:
            cluster.stop()
            logger.close()
    history = logger.history
    summary = run_summary(history, out, logger.tensorboard_dir)
    print(summary["text"], flush=True)
    return summary


def _config_dict(setup: TrainSetup) -> dict[str, Any]:
    import dataclasses

    return {
        f.name: (
            dataclasses.asdict(getattr(setup, f.name))
            if dataclasses.is_dataclass(getattr(setup, f.name))
            else getattr(setup, f.name)
        )
        for f in dataclasses.fields(setup)
    }
