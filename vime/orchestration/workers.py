"""Ray actors of the RL loop: trainer ranks and the inference service (engines + router).

Each actor runs in a process Ray places in a bundle of the placement plan. The trainer's
weights reach the engines as safetensors files in the engines' node memory (``/dev/shm``):
written there directly when both share a node, copied through Ray's object store otherwise.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def guard_owner(owner: tuple[int, str] | None, on_death: Any = None) -> None:
    """Exit (after ``on_death``) when the driver ``(pid, host)`` dies, if it is on this host."""
    if owner is None or owner[1] != socket.gethostname():
        return
    from vime.orchestration.reaper import watch_owner

    watch_owner(owner[0], on_death or (lambda: None))


def node_id() -> str:
    """The Ray node this process runs on (two nodes may share an IP address)."""
    import ray

    return ray.get_runtime_context().get_node_id()


class TrainerWorker:
    """One trainer rank: builds the backend and runs its collective calls."""

    def __init__(
        self,
        trainer_config: Any,
        loss_config: Any,
        *,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        num_threads: int,
        owner: tuple[int, str] | None = None,
        megatron_args: list[str] | None = None,
    ) -> None:
        import torch

        guard_owner(owner)
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        torch.set_num_threads(max(1, num_threads))
        if world_size > 1:
            import torch.distributed as dist

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, rank=rank, world_size=world_size)
        from vime.training import create_trainer

        self.rank = rank
        extra = (
            {"megatron_args": megatron_args or []} if trainer_config.backend == "megatron" else {}
        )
        self.trainer = create_trainer(trainer_config, loss=loss_config, **extra)

    def node(self) -> str:
        """The node this rank runs on."""
        return node_id()

    def weight_version(self) -> int:
        """Optimizer steps applied so far."""
        return self.trainer.weight_version

    def train_step(self, batch: Any) -> dict[str, float]:
        """One optimizer step on the global batch."""
        return self.trainer.train_step(batch)

    def compute_logprobs(self, batch: Any) -> list[Any]:
        """The current policy's per-token logprobs."""
        return self.trainer.compute_logprobs(batch)

    def step_logprobs(self) -> list[Any]:
        """The last train step's per-token logprobs before its update (collective)."""
        return self.trainer.step_logprobs()

    def export_to_folder(self, folder: str, dtype: str | None = None) -> str | None:
        """Write the synced weights (all, or LoRA's merged target layers) as safetensors
        buckets into ``folder`` (rank 0 only), cast to ``dtype`` (the engines') if given."""
        from vime.inference.weights import write_weights

        buckets = self.trainer.export_synced_weights()
        if self.rank != 0:
            for _ in buckets:  # collective: every rank walks the export
                pass
            return None
        return str(write_weights(buckets, folder, dtype=dtype))

    def read_folder(self, folder: str) -> dict[str, bytes]:
        """The files of a weights folder, for a copy to another node."""
        return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}

    def remove_folder(self, folder: str) -> None:
        """Delete a weights folder this rank wrote (after a copy to another node)."""
        from vime.inference.weights import remove_weights

        remove_weights(folder)

    def save(self, directory: str) -> str:
        """Checkpoint the trainer (collective)."""
        return str(self.trainer.save(directory))

    def load(self, directory: str) -> None:
        """Restore a trainer checkpoint (collective)."""
        self.trainer.load(directory)

    def save_hf(self, directory: str) -> str:
        """Write the current policy as a plain HF model folder (collective)."""
        return str(self.trainer.save_hf(directory))


class InferenceWorker:
    """The inference service (N engines + router) on the engines' node."""

    def __init__(self, serve_config: Any, owner: tuple[int, str] | None = None) -> None:
        from vime.inference.service import InferenceService

        self.service = InferenceService(serve_config)
        self._folders: list[str] = []  # the weight folders loaded, oldest first
        guard_owner(owner, self.service.stop)

    def start(self) -> dict[str, Any]:
        """Start engines and router; returns the URLs to use."""
        self.service.start()
        return {
            "base_url": self.service.base_url,
            "engine_urls": self.service.engine_urls,
            "model_name": self.service.model_name,
            "node": node_id(),
        }

    def update_from_folder(self, folder: str, version: int) -> dict[str, float]:
        """Load weights written on this node into every engine as ``version``."""
        report = self.service.update_weights(folder, version)
        self._retire(folder)
        return {
            "sync/pause_s": report.pause_s,
            "sync/load_s": report.load_s,
            "sync/resume_s": report.resume_s,
            "sync/bytes": float(report.bytes_loaded),
        }

    def update_from_files(self, files: dict[str, bytes], version: int) -> dict[str, float]:
        """Write weight files received from another node, then load them."""
        from vime.inference.weights import weights_root

        folder = weights_root() / f"recv-{socket.gethostname()}-{os.getpid()}-v{version}"
        tmp = folder.with_name(folder.name + ".partial")
        tmp.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        tmp.rename(folder)
        return self.update_from_folder(str(folder), version)

    def _retire(self, folder: str) -> None:
        # The service reloads the newest folder into a restarted engine, and the sync rewrites
        # the one before it in place next time: only older folders go.
        from vime.inference.weights import remove_weights

        if folder in self._folders:
            self._folders.remove(folder)
        self._folders.append(folder)
        while len(self._folders) > 2:
            remove_weights(self._folders.pop(0))

    def pause(self) -> None:
        """Stop the engines from generating (colocated training runs meanwhile)."""
        self._post_all("/pause", params={"mode": "wait"})

    def resume(self) -> None:
        """Let the engines generate again."""
        self._post_all("/resume")

    def _post_all(self, path: str, **kwargs: Any) -> None:
        import httpx

        for url in self.service.engine_urls:
            httpx.post(f"{url}{path}", timeout=600, **kwargs).raise_for_status()

    def stop(self) -> None:
        """Stop engines and router."""
        self.service.stop()
        from vime.inference.weights import remove_weights

        for folder in self._folders:
            remove_weights(folder)
        self._folders.clear()
