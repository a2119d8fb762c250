"""Fixtures for end-to-end `vime train` runs: a tiny model and a file of arithmetic tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vime.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", family="qwen2", seed=0)


@pytest.fixture(scope="session")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "arith.jsonl"
    rows = [
        {"id": f"t{i}", "question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}
        for i in range(64)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_argv(model: Path, tasks: Path, out: Path, *extra: str) -> list[str]:
    """A small, fast `vime train` command line for a tiny model on CPU."""
    return [
        sys.executable, "-m", "vime", "train",
        "--model", str(model), "--env", "parity_env:test/Parity-v0", "--tasks", str(tasks),
        "--output-dir", str(out), "--rollout-batch-size", "2", "--n", "2",
        "--max-tokens", "8", "--max-turns", "1", "--lr", "1e-3",
        "--vllm-max-model-len", "256", "--vllm-enforce-eager",
        *extra,
    ]  # fmt: skip


def run_env() -> dict[str, str]:
    # parity_env.py (beside this file) must import in the driver, which plays the episodes.
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
    }


def run_train(argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=run_env(), cwd=ROOT
    )
    assert result.returncode == 0, (
        f"vime train failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class TrainRunner:
    """Runs `vime train` as a user would and reads what it wrote."""

    argv = staticmethod(train_argv)
    env = staticmethod(run_env)
    run = staticmethod(run_train)
    read_jsonl = staticmethod(read_jsonl)


@pytest.fixture
def vime_train() -> type[TrainRunner]:
    return TrainRunner
