"""Typed options of ``vime serve`` and of every command that starts engines and a router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError


@dataclass
class ServeConfig:
    """vLLM engines behind vllm-router. Other engine flags: --vllm-X; router flags: --router-X."""

    model: str = option(help="HF model folder (or name) every engine serves.")
    rollout_num_engines: int = option(1, help="Number of vLLM engine processes.")
    rollout_num_gpus_per_engine: int = option(
        1, help="GPUs per engine (its tensor-parallel size); 1 on CPU."
    )
    vllm_router_ip: str = option("127.0.0.1", help="Address the router listens on.")
    vllm_router_port: int = option(0, help="Router port; 0 picks a free one.")
    engine_host: str = option("127.0.0.1", help="Address the engines listen on.")
    engine_start_timeout: float = option(
        600.0, help="Seconds to wait for an engine to become healthy."
    )
    cpu_kvcache_gib: int = option(
        1, help="KV cache per engine on CPU, in whole GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    restart_dead_engines: bool = option(
        True, help="Restart an engine that dies and re-add it to the router."
    )
    health_interval: float = option(1.0, help="Seconds between liveness checks.")
    log_dir: str | None = option(
        None, help="Folder for engine and router logs (default: a new temp folder)."
    )
    weight_update_mode: Literal["wait", "abort"] = option(
        "wait",
        help="How a weight update treats in-flight requests: let them finish, or abort them.",
    )
    vllm_args: list[str] = option([], help="Extra flags for every engine.", cli=False)
    router_args: list[str] = option([], help="Extra flags for the router.", cli=False)

    def __post_init__(self) -> None:
        if self.rollout_num_engines < 1:
            raise ConfigError(
                f"--rollout-num-engines must be at least 1, got {self.rollout_num_engines}"
            )
        if self.rollout_num_gpus_per_engine < 1:
            raise ConfigError(
                f"--rollout-num-gpus-per-engine must be at least 1, got "
                f"{self.rollout_num_gpus_per_engine}"
            )
        if not 0 <= self.vllm_router_port <= 65535:
            raise ConfigError(
                f"--vllm-router-port must be in 0..65535, got {self.vllm_router_port}"
            )
        if self.cpu_kvcache_gib < 1:
            raise ConfigError(
                f"--cpu-kvcache-gib must be a whole number of GiB >= 1 (vLLM reads an "
                f"integer), got {self.cpu_kvcache_gib}"
            )
        for flag in ("--port", "--host", "--tensor-parallel-size", "-tp"):
            if any(a == flag or a.startswith(flag + "=") for a in self.vllm_args):
                raise ConfigError(
                    f"--vllm-{flag.lstrip('-')} is set by Vime per engine; use "
                    f"--engine-host or --rollout-num-gpus-per-engine instead"
                )
        for flag in ("--port", "--host", "--worker-urls"):
            if any(a == flag or a.startswith(flag + "=") for a in self.router_args):
                raise ConfigError(
                    f"--router{flag[1:]} is set by Vime; use --vllm-router-ip/--vllm-router-port "
                    f"(the engines become the router's workers automatically)"
                )
