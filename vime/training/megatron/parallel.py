"""Process groups for Megatron: the default group (one process if none exists) and mpu's groups."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from vime.training.megatron.config import MegatronConfig


def init_parallel(mcfg: MegatronConfig, seed: int) -> None:
    """Join (or create, for a single process) the default group and build TP/DP groups.

    A job already initialised with the same layout is reused; a different layout is an error
    because Megatron keeps one global set of groups per process.
    """
    from megatron.core import parallel_state as mpu

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        from vime.training.launch import free_port

        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
        )
    mcfg.data_parallel_size(dist.get_world_size())
    if mpu.model_parallel_is_initialized():
        tp = mpu.get_tensor_model_parallel_world_size()
        ep = mpu.get_expert_model_parallel_world_size()
        if ep != mcfg.expert_model_parallel_size:
            raise RuntimeError(
                f"Megatron groups already exist with expert parallel size {ep}, but this trainer "
                f"asks for {mcfg.expert_model_parallel_size}; one process holds one layout"
            )
        if tp != mcfg.tensor_model_parallel_size:
            raise RuntimeError(
                f"Megatron groups already exist with tensor parallel size {tp}, but this trainer "
                f"asks for {mcfg.tensor_model_parallel_size}; one process holds one layout"
            )
    else:
        mpu.initialize_model_parallel(
            tensor_model_parallel_size=mcfg.tensor_model_parallel_size,
            pipeline_model_parallel_size=mcfg.pipeline_model_parallel_size,
            expert_model_parallel_size=mcfg.expert_model_parallel_size,
        )
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
