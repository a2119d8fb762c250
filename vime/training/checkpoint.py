"""Atomic checkpoint folders: files are written to a temporary sibling, fsynced, then renamed.

A manifest written last lists every file with its size, so a folder without a valid manifest
(an interrupted copy, a truncated file) is refused with a clear :class:`CheckpointError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vime.errors import VimeError

MANIFEST = "vime_checkpoint.json"
DIGEST_SUFFIX = ".sha256"  # a file's SHA-256, written beside it until the manifest takes it
TRAINER_STATE = "trainer_state.json"
FORMAT_VERSION = 1


class CheckpointError(VimeError):
    """A checkpoint folder is missing, incomplete or unreadable."""


def temp_dir_for(target: Path) -> Path:
    """The temporary sibling a checkpoint of ``target`` is written into (same filesystem)."""
    return target.parent / f".{target.name}.tmp"


def fsync_path(path: Path) -> None:
    """Flush a file or a directory entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_temp_dir(target: Path) -> Path:
    """Create an empty temporary folder for ``target`` (removing a leftover of a crash)."""
    tmp = temp_dir_for(target)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def write_manifest(tmp: Path, meta: dict[str, Any]) -> None:
    """Write the manifest (sizes of every file in ``tmp``, the SHA-256 of those
    :func:`save_object` wrote, plus ``meta``) and fsync everything."""
    files, digests = {}, {}
    for f in sorted(tmp.iterdir()):
        if f.is_file() and f.name != MANIFEST and not f.name.endswith(DIGEST_SUFFIX):
            fsync_path(f)
            files[f.name] = f.stat().st_size
            sidecar = f.with_name(f.name + DIGEST_SUFFIX)
            if sidecar.is_file():
                digests[f.name] = sidecar.read_text().strip()
    for sidecar in tmp.glob(f"*{DIGEST_SUFFIX}"):
        sidecar.unlink()
    manifest = {"format_version": FORMAT_VERSION, "files": files, "sha256": digests, **meta}
    path = tmp / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    fsync_path(path)
    fsync_path(tmp)


def commit(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` folder to ``target``, replacing an older checkpoint there."""
    old = target.parent / f".{target.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    fsync_path(target.parent)
    if old.exists():
        shutil.rmtree(old)


def abort(target: Path) -> None:
    """Remove the temporary folder of a failed save; ``target`` is left as it was."""
    shutil.rmtree(temp_dir_for(target), ignore_errors=True)


@contextlib.contextmanager
def atomic_checkpoint(target: str | Path, meta: dict[str, Any]) -> Iterator[Path]:
    """Yield a temporary folder to write into; on success it becomes ``target`` atomically.

    On an exception the temporary folder is removed and the previous checkpoint at ``target``
    (if any) is untouched.
    """
    target = Path(target).absolute()
    tmp = prepare_temp_dir(target)
    try:
        yield tmp
        write_manifest(tmp, meta)
    except BaseException:
        abort(target)
        raise
    commit(tmp, target)


def save_distributed(
    target: str | Path,
    *,
    rank: int,
    barrier: Callable[[], None],
    write_rank: Callable[[Path], None],
    write_main: Callable[[Path], None] | None = None,
    trainer_state: dict[str, Any],
    backend: str,
) -> Path:
    """Atomic checkpoint written by every rank of a trainer; all ranks must call it.

    Each rank writes its own files with ``write_rank(tmp)``; then rank 0 writes the shared
    ones (``write_main``, if any), ``trainer_state.json`` and the manifest, and commits. A failure on
    rank 0 leaves the previous checkpoint untouched.
    """
    target = Path(target).absolute()
    if rank == 0:
        prepare_temp_dir(target)
    barrier()
    tmp = temp_dir_for(target)
    write_rank(tmp)
    barrier()
    if rank == 0:
        try:
            if write_main is not None:
                write_main(tmp)
            (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
            write_manifest(tmp, {"backend": backend})
        except BaseException:
            abort(target)
            raise
        commit(tmp, target)
    barrier()
    return target


def read_trainer_state(directory: str | Path, backend: str) -> dict[str, Any]:
    """Validate a checkpoint written by ``backend`` and return its ``trainer_state.json``."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.get("backend") != backend:
        raise CheckpointError(
            f"{str(directory)!r} was written by the {manifest.get('backend')!r} backend; "
            f"the {backend} backend cannot load it"
        )
    try:
        return json.loads((directory / TRAINER_STATE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {TRAINER_STATE}: {exc}") from None


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint; raises ``CheckpointError`` if it is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        hint = ""
        if temp_dir_for(directory.absolute()).exists():
            hint = " (a temporary folder of an interrupted save exists next to it)"
        raise CheckpointError(f"checkpoint {str(directory)!r} does not exist{hint}")
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{str(directory)!r} is not a Vime checkpoint: {MANIFEST} is missing (was the save "
            "interrupted, or is this an HF model folder? load HF weights with --hf-checkpoint)"
        ) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {str(path)!r}: {exc}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{str(path)!r} has format_version {manifest.get('format_version')!r}; this Vime "
            f"reads version {FORMAT_VERSION}"
        )
    for name, size in manifest.get("files", {}).items():
        f = directory / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(directory)!r} is missing {name!r}")
        if f.stat().st_size != size:
            raise CheckpointError(
                f"checkpoint file {str(f)!r} has {f.stat().st_size} bytes, the manifest says "
                f"{size}: the checkpoint is corrupt"
            )
    return manifest


def save_object(obj: Any, path: Path) -> None:
    """``torch.save`` an object, without zip CRCs (:func:`_without_zip_crc32`), through a
    :class:`_HashingWriter`: its SHA-256 goes into the sidecar ``<name>.sha256``, which
    :func:`write_manifest` moves into the manifest (:func:`recorded_digests`)."""
    import torch

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writer = _HashingWriter(fd)
        with _without_zip_crc32():
            torch.save(obj, writer)
        writer.finish()
    finally:
        os.close(fd)
    Path(f"{path}{DIGEST_SUFFIX}").write_text(writer.hexdigest())


def recorded_digests(directory: str | Path) -> dict[str, str]:
    """``{file name: SHA-256}`` of the files of a trainer checkpoint that were hashed as they
    were written (empty for an older checkpoint or a folder without a manifest)."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    digests = manifest.get("sha256")
    return dict(digests) if isinstance(digests, dict) else {}


class _HashingWriter:
    """The binary file ``torch.save`` writes into: hashes the bytes as they pass, and every
    ``flush_bytes`` flushes them to disk and drops them from the page cache.

    Without it, a 1.6 GB save first filled the page cache, where new pages cost up to 3.5 s
    of kernel time a GB on the dev box's VM, and the run checkpoint then read every byte back
    to hash it."""

    def __init__(self, fd: int, flush_bytes: int = 256 << 20) -> None:
        import hashlib

        self._fd = fd
        self._sha = hashlib.sha256()
        self._flush_bytes = flush_bytes
        self._written = 0
        self._flushed = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._sha.update(view)
        done = 0
        while done < len(view):
            done += os.write(self._fd, view[done:])
        self._written += done
        if self._written - self._flushed >= self._flush_bytes:
            self._drop_written()
        return done

    def flush(self) -> None:
        """Nothing is buffered here (``torch.save`` may call it)."""

    def finish(self) -> None:
        """Flush the rest to disk and drop it from the page cache."""
        self._drop_written()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def _drop_written(self) -> None:
        os.fdatasync(self._fd)
        if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the pages just stay cached
            length = self._written - self._flushed
            os.posix_fadvise(self._fd, self._flushed, length, os.POSIX_FADV_DONTNEED)
        self._flushed = self._written


@contextlib.contextmanager
def _without_zip_crc32() -> Iterator[None]:
    """``torch.save`` in this thread without the CRC-32 of each record of its zip file (the
    setting is per thread).

    ``torch.load`` never checks those CRCs (a flipped byte loads silently), so they protect
    nothing; a run checkpoint's SHA-256 of every file does (``checksums.json``). Without them
    ``torch.save`` wrote SmolLM2-135M's fp32 weights and Adam moments (1.6 GB) in 0.36 s
    instead of 0.70 s on the 2-core dev box."""
    import torch.serialization

    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


def load_object(path: Path) -> Any:
    """``torch.load`` a file written by :func:`save_object`, as ``CheckpointError`` on failure."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing") from None
    except Exception as exc:
        raise CheckpointError(f"checkpoint file {str(path)!r} is unreadable: {exc}") from exc


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and CUDA) generators."""
    import numpy as np
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
