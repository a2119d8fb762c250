"""GPU weight updates through vLLM's own weight-transfer engines (NCCL or CUDA IPC).

vLLM ships the trainer side (``NCCLTrainerWeightTransferEngine``,
``IPCTrainerWeightTransferEngine``) and drives the handshake through any object with the
``VLLMWeightSyncClient`` methods. :class:`EngineFanout` is that object for N engines: it
gives each engine its own NCCL ranks, pauses every engine before the transfer, stamps the new
version and resumes them after it, and can put colocated engines to sleep and wake them.
:class:`ExportedWeights` adapts ``Trainer.export_weights()`` to vLLM's ``WeightSource``.
Engines must be started with ``--vllm-weight-transfer-config '{"backend": "nccl"}'`` (or
``"ipc"``). This path needs CUDA; on CPU vLLM answers "Weight transfer not configured".
Import this module only on the GPU path: it imports vLLM.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import httpx
import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from vime.inference.weights import WeightUpdater


class EngineFanout:
    """vLLM's ``VLLMWeightSyncClient`` protocol, fanned out to every engine over HTTP.

    ``tp_per_engine`` is each engine's number of workers (its TP size); in the shared NCCL
    group the trainer is rank 0 and engine ``i`` owns ranks ``1 + i*tp ... (i+1)*tp``.
    """

    def __init__(
        self,
        engine_urls: list[str],
        *,
        tp_per_engine: int = 1,
        mode: Literal["wait", "abort"] = "wait",
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.engine_urls = list(engine_urls)
        self.tp_per_engine = tp_per_engine
        self.mode = mode
        self.timeout = timeout
        self.transport = transport
        self.version: int | None = None  # stamped by finish_weight_update

    @property
    def world_size(self) -> int:
        """Size of the trainer + workers NCCL group."""
        return 1 + len(self.engine_urls) * self.tp_per_engine

    def _post_all(self, path: str, bodies: list[dict | None] | dict | None = None, **kw: Any):
        if not isinstance(bodies, list):
            bodies = [bodies] * len(self.engine_urls)

        async def go() -> None:
            async with httpx.AsyncClient(timeout=self.timeout, transport=self.transport) as http:
                await asyncio.gather(
                    *(
                        WeightUpdater._post(http, url, path, path.strip("/"), json=body, **kw)
                        for url, body in zip(self.engine_urls, bodies, strict=True)
                    )
                )

        asyncio.run(go())

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join every engine to the transfer group (concurrently: they rendezvous together)."""
        bodies = []
        for i in range(len(self.engine_urls)):
            info = dict(init_info)
            if "rank_offset" in info:  # NCCL: each engine's workers take their own ranks
                info["rank_offset"] = int(info["rank_offset"]) + i * self.tp_per_engine
            bodies.append({"init_info": info})
        self._post_all("/init_weight_transfer_engine", bodies)

    def start_weight_update(self) -> None:
        """Pause generation on every engine, then open the update."""
        self._post_all("/pause", params={"mode": self.mode})
        self._post_all("/start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        """Tell every engine what is coming; they receive while the trainer sends."""
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        self._post_all("/update_weights", {"update_info": _json_safe_update_payload(update_info)})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Close the update with the new version, then resume generation."""
        version = weight_version if weight_version is not None else self.version
        body = {"weight_version": str(version)} if version is not None else None
        self._post_all("/finish_weight_update", body)
        self._post_all("/resume")

    def shutdown_weight_transfer_engine(self) -> None:
        """Tear the transfer group down on every engine."""
        self._post_all("/shutdown_weight_transfer_engine")

    def sleep(self, level: int = 1) -> None:
        """Free the engines' GPU memory for a colocated trainer (level 1 keeps weights in
        host memory, level 2 drops them)."""
        self._post_all("/sleep", params={"level": level})

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Give the engines their GPU memory back (``tags``: "weights", "kv_cache")."""
        self._post_all("/wake_up", params={"tags": tags} if tags else None)


class ExportedWeights(WeightSource):
    """vLLM ``WeightSource`` over ``export()`` -> buckets of ``(hf_name, tensor)``.

    ``export`` is called afresh for every pass (e.g. ``trainer.export_weights``); the
    metadata comes from the first pass and is checked against each later one, because
    vLLM sizes its receive buffers from it.
    """

    def __init__(self, export: Callable[[], Iterable[list[tuple[str, torch.Tensor]]]]) -> None:
        self._export = export
        self._meta: list[ParamMeta] | None = None

    def metadata(self) -> list[ParamMeta]:
        """``ParamMeta(name, dtype, shape)`` for every tensor, in export order."""
        if self._meta is None:
            self._meta = [
                ParamMeta(name, t.dtype, tuple(t.shape)) for bucket in self._export()
                for name, t in bucket
            ]  # fmt: skip
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        meta = self.metadata()
        i = 0
        for bucket in self._export():
            for name, tensor in bucket:
                if i >= len(meta) or meta[i].name != name or tuple(tensor.shape) != meta[i].shape:
                    raise ValueError(
                        f"weight export changed between passes at tensor {i} ({name!r}); "
                        f"export the same names and shapes in the same order every time"
                    )
                i += 1
                yield name, tensor
        if i != len(meta):
            raise ValueError(f"weight export yielded {i} tensors, the first pass {len(meta)}")


def connect_nccl(
    fanout: EngineFanout,
    source: ExportedWeights,
    *,
    master_address: str,
    master_port: int,
    packed: bool = True,
) -> Any:
    """Open the NCCL group between this trainer (rank 0) and every engine's workers and
    return vLLM's trainer engine; call ``.send_weights()`` on it per update."""
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    info = NCCLTrainerInitInfo(
        master_address=master_address,
        master_port=master_port,
        world_size=fanout.world_size,
        packed=packed,
        rank=0,
    )
    return NCCLTrainerWeightTransferEngine.trainer_init(info, client=fanout, source=source)


def connect_ipc(fanout: EngineFanout, source: ExportedWeights, *, packed: bool = True) -> Any:
    """Set up CUDA-IPC transfer (trainer and engines share GPUs) and return vLLM's trainer
    engine; call ``.send_weights()`` on it per update."""
    from vllm.distributed.weight_transfer.ipc_engine import (
        IPCTrainerInitInfo,
        IPCTrainerWeightTransferEngine,
    )

    info = IPCTrainerInitInfo(packed=packed, rank=0)
    return IPCTrainerWeightTransferEngine.trainer_init(info, client=fanout, source=source)


def send_update(trainer_engine: Any, fanout: EngineFanout, version: int) -> None:
    """One GPU weight update: pause, transfer, stamp ``version``, resume."""
    fanout.version = version
    trainer_engine.send_weights()
