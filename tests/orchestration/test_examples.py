"""Every GPU example's launch script validates with --dry-run on this CPU machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "name",
    [
        "qwen3_math_megatron",
        "qwen3_math_megatron_pp",
        "qwen3_moe_math_megatron",
        "qwen3_math_lora",
        "coding_agent_docker",
        "async_math",
        "repofix_agent",
    ],
)
def test_example_launch_script_dry_runs(name: str) -> None:
    env = {
        **os.environ,
        "MODEL": "/models/Qwen3-1.7B",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    out = subprocess.run(
        [str(EXAMPLES / name / "run.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "device: GPU" in out.stdout
    assert "cluster resources needed: CPU=8, GPU=8" in out.stdout


def test_the_colocated_megatron_example_shares_each_gpu() -> None:
    env = {
        **os.environ,
        "MODEL": "/m",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    out = subprocess.run(
        [str(EXAMPLES / "qwen3_math_megatron" / "run.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "bundle 7: {CPU=1, GPU=1} <- trainer rank 7, engine 3 (tp rank 1)" in out.stdout
    assert "megatron flags: --tensor-model-parallel-size 2" in out.stdout
