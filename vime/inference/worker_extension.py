"""A vLLM worker extension (``--worker-extension-cls``) that loads weights Vime wrote.

The trainer side writes HF-named tensors as safetensors files into one folder (in
``/dev/shm`` on one machine, so reading them is a memory map, not disk I/O); every worker
of every engine reads the same folder through ``collective_rpc``. This module is imported
inside vLLM's worker processes, so it imports vLLM and torch freely.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _iter_folder(folder: Path, counts: dict[str, int]) -> Iterator[tuple[str, object]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensor = f.get_tensor(name)
                counts["tensors"] += 1
                counts["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor


def _tied_modules(model: Any) -> list[Any]:
    """Modules with a quant method whose ``weight`` shares storage with another such module."""
    import torch

    owners: dict[int, list[Any]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is None or not isinstance(weight, torch.Tensor):
            continue
        if weight.numel() and not weight.is_meta:
            owners.setdefault(weight.untyped_storage().data_ptr(), []).append(module)
    return [module for group in owners.values() if len(group) > 1 for module in group]


class VimeWorkerExtension:
    """Methods mixed into each vLLM worker; called as ``collective_rpc("vime_...")``."""

    def vime_load_weights(self, folder: str) -> dict[str, int]:
        """Load every tensor of the safetensors files in ``folder`` into the model in place.

        Names are HF checkpoint names; vLLM's loader fuses q/k/v and gate/up itself.
        Returns how many tensors and bytes were read.
        """
        counts = {"tensors": 0, "bytes": 0}
        tied = _tied_modules(self.model_runner.get_model())  # type: ignore[attr-defined]
        self.model_runner.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=_iter_folder(Path(folder), counts), is_checkpoint_format=True
        )
        for module in tied:
            # A module whose weight is tied to another's (lm_head = embed_tokens) receives no
            # tensor of its own, so vLLM's layerwise reload never re-processes it: on CPU its
            # prepacked GEMM copy kept the old weights while the shared parameter changed.
            module.quant_method.process_weights_after_loading(module)
        return counts

    def vime_weight_checksum(self) -> float:
        """A cheap fingerprint of the loaded weights (sum of every parameter, as float)."""
        import torch

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        with torch.no_grad():
            return float(sum(p.detach().double().sum() for p in model.parameters()))
