"""Write a trainer's current weights as an HF model folder (safetensors shards + the source's
config and tokenizer files), atomically, for engines that reload weights from disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from vime.training import checkpoint as ckpt

if TYPE_CHECKING:
    from vime.training.base import Trainer

# Files of the source folder that hold weights; everything else (config, tokenizer, chat
# template, generation config) is copied unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _copy_non_weight_files(source: Path, out: Path) -> None:
    for f in sorted(source.iterdir()):
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _WEIGHT_INDEXES:
            shutil.copy2(f, out / f.name)


def save_hf_checkpoint(
    trainer: Trainer, directory: str | Path, *, max_shard_bytes: int = 2 << 30
) -> Path:
    """Write ``trainer``'s weights under their HF names into ``directory`` (collective).

    One shard gives ``model.safetensors``; more give ``model-0000k-of-0000n.safetensors``
    plus ``model.safetensors.index.json``. Only rank 0 writes; every rank must call this.
    The folder appears complete or not at all.
    """
    from safetensors.torch import save_file

    source = Path(trainer.config.hf_checkpoint)
    target = Path(directory).absolute()
    rank0 = trainer.rank == 0
    tmp = ckpt.prepare_temp_dir(target) if rank0 else None
    shards: list[list[str]] = []
    total = 0
    try:
        for bucket in trainer.export_weights(bucket_bytes=max_shard_bytes):
            if tmp is None:
                continue  # only rank 0 receives buckets; the others drive the gathers
            tensors = {name: t.detach().contiguous().cpu() for name, t in bucket}
            save_file(tensors, tmp / f"shard-{len(shards)}.safetensors", metadata={"format": "pt"})
            shards.append(list(tensors))
            total += sum(t.numel() * t.element_size() for t in tensors.values())
        if tmp is None:
            _barrier()
            return target
        if len(shards) == 1:
            (tmp / "shard-0.safetensors").rename(tmp / "model.safetensors")
        else:
            weight_map = {}
            for k, names in enumerate(shards):
                name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
                (tmp / f"shard-{k}.safetensors").rename(tmp / name)
                weight_map.update(dict.fromkeys(names, name))
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        _copy_non_weight_files(source, tmp)
        for f in tmp.iterdir():
            ckpt.fsync_path(f)
        ckpt.fsync_path(tmp)
    except BaseException:
        if tmp is not None:
            ckpt.abort(target)
        raise
    ckpt.commit(tmp, target)
    _barrier()
    return target


def _barrier() -> None:
    """Wait until rank 0 has committed the folder (no-op in one process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
