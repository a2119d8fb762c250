"""Export the policy as a plain HF model folder that transformers and ``vllm serve`` load."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

# Files of the source model folder that describe the model but are not weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def export_hf_folder(weights_folder: str | Path, source_model: str | Path, out: str | Path) -> Path:
    """Assemble ``out`` from the trainer's weight buckets and the source model's config and
    tokenizer files (chat template included); written under a temp name, then renamed."""
    from safetensors import safe_open

    weights_folder, source_model, out = Path(weights_folder), Path(source_model), Path(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in source_model.iterdir():
        if (
            item.is_file()
            and not item.name.endswith(WEIGHT_SUFFIXES)
            and item.name != "model.safetensors.index.json"
        ):
            shutil.copy2(item, tmp / item.name)
    files = sorted(weights_folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {weights_folder}")
    weight_map: dict[str, str] = {}
    total = 0
    for i, f in enumerate(files):
        name = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        shutil.copy2(f, tmp / name)
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 - safe_open is not a dict
                weight_map[key] = name
        total += f.stat().st_size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out
