"""Weight updates on engines: write tensors to shared memory, then pause → load → resume.

The trainer side writes HF-named tensors in buckets of safetensors files under
``/dev/shm`` (:func:`write_weights`); :class:`WeightUpdater` then drives every engine
directly (never through the router, which would send the call to one engine only):
``/pause`` (``wait`` drains in-flight requests, ``abort`` ends them with
``finish_reason="abort"``), ``/collective_rpc vime_load_weights`` (the worker extension reads
the folder), ``/update_weight_version``, ``/resume``. A failed step still resumes the engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import httpx

from vime.inference.errors import InferenceError

if TYPE_CHECKING:
    import torch

SHM_ROOT = Path("/dev/shm")


def weights_root() -> Path:
    """Where weight folders go: ``/dev/shm`` when it exists (memory), else the temp dir."""
    root = SHM_ROOT if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK) else None
    return Path(root or tempfile.gettempdir()) / "vime-weights"


# vLLM's --dtype values, as torch dtype names.
_VLLM_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16",
                "float": "float32", "float32": "float32"}  # fmt: skip


def engine_dtype(vllm_args: list[str], model_dir: str | Path) -> str | None:
    """The dtype the engines hold their weights in, when it is known for sure: ``--dtype``
    of ``vllm_args``, or with ``auto`` (or none) a bf16/fp16 ``torch_dtype`` of the model's
    config.json (vLLM keeps those; an fp32 config is left to vLLM's own choice: None).

    A sync that writes tensors in this dtype moves half the bytes of fp32 master weights and
    gives the engine the same values: its loader casts to this dtype anyway."""
    from vime.config.passthrough import flag_value

    value = flag_value(vllm_args, "--dtype") or "auto"
    if value != "auto":
        return _VLLM_DTYPES.get(value)
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    named = config.get("torch_dtype") or config.get("dtype")
    return named if named in ("bfloat16", "float16") else None


def write_weights(
    buckets: Iterable[list[tuple[str, torch.Tensor]]],
    folder: str | Path | None = None,
    dtype: str | None = None,
) -> Path:
    """Write each bucket as one safetensors file in a folder (default: a new one under
    /dev/shm) and return it.

    Accepts the output of ``Trainer.export_weights()`` or of :func:`vime.training.buckets.bucket_tensors`.
    With ``dtype`` (a torch dtype name) floating-point tensors are cast to it as they are copied.
    A new folder appears complete or not at all. An existing ``folder`` (an earlier call's) is
    rewritten in place, each file whose layout is unchanged without reallocating its memory
    (:mod:`vime.inference.weight_files`): no reader may be loading it meanwhile (the weight sync
    alternates two folders), and a failed rewrite removes it. Delete it with
    :func:`remove_weights`.
    """
    import torch

    from vime.inference.weight_files import release, write_tensors

    cast = getattr(torch, dtype) if dtype else None
    target = Path(folder) if folder is not None else weights_root() / uuid.uuid4().hex
    in_place = target.is_dir()
    out = target if in_place else target.with_name(target.name + ".partial")
    if not in_place:
        shutil.rmtree(out, ignore_errors=True)  # a write of this folder that was killed
    out.mkdir(parents=True, exist_ok=in_place)
    try:
        seen: set[str] = set()
        count = 0
        for count, bucket in enumerate(buckets, start=1):
            tensors = []
            for name, tensor in bucket:
                if name in seen:
                    raise ValueError(f"tensor {name!r} appears twice in the exported weights")
                seen.add(name)
                tensors.append((name, tensor))
            write_tensors(out / f"bucket-{count - 1:05d}.safetensors", tensors, cast)
        if not seen:
            raise ValueError("no tensors to write: the weight export was empty")
        for stale in out.glob("bucket-*.safetensors"):
            if int(stale.stem.removeprefix("bucket-")) >= count:
                stale.unlink()
        if not in_place:
            out.rename(target)
    except BaseException:
        release(out)
        shutil.rmtree(out, ignore_errors=True)
        raise
    return target


def remove_weights(folder: str | Path) -> None:
    """Delete a folder written by :func:`write_weights` (unmapping the files this process
    keeps mapped there for their next rewrite)."""
    from vime.inference.weight_files import release

    release(Path(folder))
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class UpdateReport:
    """What one weight update did and how long each phase took (seconds)."""

    version: int
    engines: list[str]
    pause_s: float = 0.0
    load_s: float = 0.0
    resume_s: float = 0.0
    total_s: float = 0.0
    bytes_loaded: int = 0
    tensors_loaded: int = 0
    per_engine: dict[str, dict] = field(default_factory=dict)


class WeightUpdater:
    """Drives pause → load → version → resume on engines over HTTP, all engines per phase."""

    def __init__(
        self,
        *,
        mode: Literal["wait", "abort"] = "wait",
        timeout: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if mode not in ("wait", "abort"):
            raise ValueError(f"weight update mode must be 'wait' or 'abort', got {mode!r}")
        self.mode = mode
        self.timeout = timeout
        self.transport = transport

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout, transport=self.transport)

    @staticmethod
    async def _post(
        http: httpx.AsyncClient, url: str, path: str, step: str, **kwargs: object
    ) -> httpx.Response:
        try:
            r = await http.post(f"{url}{path}", **kwargs)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            raise InferenceError(f"weight update: {step} on {url} failed: {exc!r}") from exc
        if r.status_code >= 400:
            raise InferenceError(
                f"weight update: {step} on {url} answered {r.status_code}: {r.text[:500]}"
            )
        return r

    async def set_version(self, urls: list[str], version: int) -> None:
        """Tag the engines' outputs with ``version`` (no weights change)."""
        async with self._client() as http:
            await asyncio.gather(
                *(
                    self._post(
                        http,
                        u,
                        "/update_weight_version",
                        "set version",
                        json={"new_version": str(version)},
                    )
                    for u in urls
                )
            )

    async def update(self, urls: list[str], folder: str, version: int) -> UpdateReport:
        """Load the safetensors in ``folder`` into every engine at ``urls`` as ``version``."""
        if not urls:
            raise InferenceError("weight update: no healthy engine to update")
        if not Path(folder).is_dir():
            raise InferenceError(f"weight update: {folder} is not a folder of safetensors files")
        report = UpdateReport(version=version, engines=list(urls))
        start = time.perf_counter()
        async with self._client() as http:
            paused: list[str] = []
            try:
                t = time.perf_counter()
                await asyncio.gather(*(self._pause(http, u, paused) for u in urls))
                report.pause_s = time.perf_counter() - t
                t = time.perf_counter()
                results = await asyncio.gather(*(self._load(http, u, folder) for u in urls))
                report.load_s = time.perf_counter() - t
                for url, counts in zip(urls, results, strict=True):
                    report.per_engine[url] = counts
                report.tensors_loaded = results[0]["tensors"]
                report.bytes_loaded = results[0]["bytes"]
                await asyncio.gather(
                    *(
                        self._post(
                            http,
                            u,
                            "/update_weight_version",
                            "set version",
                            json={"new_version": str(version)},
                        )
                        for u in urls
                    )
                )
            finally:
                t = time.perf_counter()
                # Resume whatever was paused even when a step failed, so no engine stays stuck.
                outcomes = await asyncio.gather(
                    *(self._post(http, u, "/resume", "resume") for u in paused),
                    return_exceptions=True,
                )
                report.resume_s = time.perf_counter() - t
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        report.total_s = time.perf_counter() - start
        return report

    async def _pause(self, http: httpx.AsyncClient, url: str, paused: list[str]) -> None:
        paused.append(url)  # resume even if the pause call itself fails half-way
        await self._post(http, url, "/pause", f"pause ({self.mode})", params={"mode": self.mode})

    async def _load(self, http: httpx.AsyncClient, url: str, folder: str) -> dict:
        r = await self._post(
            http,
            url,
            "/collective_rpc",
            "load weights",
            json={"method": "vime_load_weights", "args": [folder]},
        )
        results = r.json().get("results") or [{}]
        first = results[0] if isinstance(results[0], dict) else {}
        return {"tensors": int(first.get("tensors", 0)), "bytes": int(first.get("bytes", 0))}
