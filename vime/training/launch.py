"""Run a function in several local processes joined in a torch process group (tests, CPU runs).

Each process gets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*`` set and the default group
initialised (gloo on CPU, nccl with GPUs); results come back pickled, in rank order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    fn: Callable[..., Any],
    args: tuple,
    results: mp.Queue,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    import torch
    import torch.distributed as dist

    # Processes share the machine's cores; oversubscription makes CPU runs many times slower.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        value = fn(*args)
        # Plain pickle copies tensors by value (torch's queue would share memory with a child
        # that is about to exit).
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 600.0,
) -> list[Any]:
    """Call ``fn(*args)`` in ``world_size`` fresh processes; return their results by rank.

    ``fn`` must be importable (a module-level function). If any rank raises, the others are
    terminated and a ``RuntimeError`` carries that rank's traceback; so does a timeout.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, backend, fn, args, results))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"spawn: {fn.__name__} did not finish within {timeout} s")
            try:
                rank, ok, payload = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(
                        f"spawn: a worker of {fn.__name__} died with exit code {dead[0].exitcode}"
                    ) from None
                continue
            if not ok:
                raise RuntimeError(f"spawn: rank {rank} of {fn.__name__} failed:\n{payload}")
            out[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=10 if len(out) == world_size else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [out[r] for r in range(world_size)]
