"""The RL loop's own state and its atomic checkpoints.

A checkpoint is a folder ``<save_dir>/step_<N>/`` holding the trainer's checkpoint
(``trainer/``), ``state.json`` (step, data position, RNG, counters) and ``buffer.jsonl``
(trajectories generated but not trained yet, for the async loop), and ``checksums.json``
(SHA-256 of every other file, written last). It is written under a temporary name and renamed
into place, then ``latest`` is replaced atomically, so a ``kill -9`` at any moment leaves the
previous checkpoint intact and usable. A save that fails (a full disk) removes its temporary
folder and leaves the previous checkpoints as they were. On resume, a checkpoint damaged later
(truncated or altered files) is detected by its checksums and the newest intact one is used.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import VimeError
from vime.types import Trajectory

CHECKSUMS = "checksums.json"


class RunStateError(VimeError):
    """A run checkpoint is missing or unreadable."""


class CheckpointSaveError(VimeError):
    """A run checkpoint could not be written (the previous ones are intact)."""


@dataclass
class RunState:
    """Everything besides the trainer that a resume needs to continue exactly."""

    step: int = 0  # optimizer steps done
    data_position: int = 0  # tasks consumed from the data stream
    weight_version: int = 0
    trained_samples: int = 0  # lines of trained_samples.jsonl that belong to this state
    python_rng: Any = None
    counters: dict[str, float] = field(default_factory=dict)


def _fsync_write(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(
    save_dir: str | Path,
    state: RunState,
    buffer: list[Trajectory],
    save_trainer: Callable[[Path], Any],
) -> Path:
    """Write ``step_<N>`` atomically (trainer via ``save_trainer(dir)``) and point ``latest`` at it.

    An ``OSError`` while writing (a full disk, a read-only folder) removes the partial folder
    and is raised as :class:`CheckpointSaveError`; ``latest`` and older checkpoints are untouched.
    A :class:`VimeError` from ``save_trainer`` (a trainer actor that died) is raised as it is.
    """
    save_dir = Path(save_dir)
    final = save_dir / f"step_{state.step:06d}"
    tmp = save_dir / f".tmp_step_{state.step:06d}_{os.getpid()}"
    try:
        save_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_trainer(tmp / "trainer")
        state.python_rng = random.getstate()
        _fsync_write(tmp / "state.json", json.dumps(asdict(state)))
        _fsync_write(tmp / "buffer.jsonl", "".join(json.dumps(t.to_dict()) + "\n" for t in buffer))
        checksums = _checksums(tmp, known=_trainer_digests(tmp / "trainer"))
        _fsync_write(tmp / CHECKSUMS, json.dumps(checksums, indent=1, sort_keys=True))
    except VimeError:  # explained already (a trainer actor that died mid-save): keep its words
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        full = _disk_full(save_dir, exc)
        raise CheckpointSaveError(_save_failure(final, save_dir, exc, full)) from exc
    except BaseException:  # an interrupt: nothing to explain, but leave no partial folder
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = save_dir / f".latest_{os.getpid()}"
    _fsync_write(latest_tmp, final.name)
    os.replace(latest_tmp, save_dir / "latest")
    return final


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception behind ``exc`` (Ray's RayTaskError keeps a trainer's in ``cause``)."""
    for _ in range(8):
        cause = getattr(exc, "cause", None)
        inner = cause if isinstance(cause, BaseException) else exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _disk_full(save_dir: Path, exc: BaseException) -> str | None:
    """Why a failed save looks like a full disk, or None. Vime's trainer files report ENOSPC as
    an OSError; other writers (torch's own, a backend's) may raise a RuntimeError without
    errno, so less free space than the previous checkpoint took counts too."""
    cause = _root_cause(exc)
    if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
        return cause.strerror or "ENOSPC"
    previous = latest_checkpoint_name(save_dir)
    try:
        free = shutil.disk_usage(save_dir).free
        needed = _folder_bytes(save_dir / previous) if previous else 0
    except OSError:
        return None
    if free < max(needed, 16 * 2**20):
        return f"{free / 2**20:.0f} MiB free, the previous checkpoint took {needed / 2**20:.0f} MiB"
    return None


def _save_failure(final: Path, save_dir: Path, exc: BaseException, full: str | None) -> str:
    previous = latest_checkpoint_name(save_dir)
    kept = f"the previous checkpoint {previous} is intact" if previous else "there is none yet"
    cause = _root_cause(exc)
    reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
    why = f"the disk is full ({full}; {reason})" if full else f"the write failed ({reason})"
    return (
        f"could not save the checkpoint {final}: {why}; its partial folder was removed and "
        f"{kept}. Free space (or fix the folder), then rerun the same command with --resume"
    )


def latest_checkpoint_name(save_dir: str | Path) -> str | None:
    """The folder name ``latest`` holds, without checking it."""
    pointer = Path(save_dir) / "latest"
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def _trainer_digests(trainer_dir: Path) -> dict[str, str]:
    """The SHA-256 the trainer took of its files as it wrote them, as paths under the run
    checkpoint (the trainer's checkpoint lies in its ``trainer/`` folder)."""
    from vime.training.checkpoint import recorded_digests

    prefix = trainer_dir.name
    return {f"{prefix}/{name}": d for name, d in recorded_digests(trainer_dir).items()}


def _checksums(folder: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (paths relative to it), except ``checksums.json``;
    those in ``known`` (hashed as they were written) are not read again."""
    from concurrent.futures import ThreadPoolExecutor

    known = known or {}
    paths = {
        str(f.relative_to(folder)): f
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name != CHECKSUMS
    }
    unknown = [name for name in paths if name not in known]

    def digest(name: str) -> str:
        with paths[name].open("rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()

    # hashlib lets go of the GIL over large buffers: large files hash on two cores at once.
    with ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        read = dict(zip(unknown, pool.map(digest, unknown), strict=True))
    return {name: known[name] if name in known else read[name] for name in paths}


def verify_checkpoint(path: str | Path) -> None:
    """Raise :class:`RunStateError` saying what is wrong unless every file of the checkpoint
    ``path`` is there with the checksum it was saved with."""
    path = Path(path)
    try:
        expected = json.loads((path / CHECKSUMS).read_text())
    except FileNotFoundError:
        raise RunStateError(f"{path.name}: {CHECKSUMS} is missing") from None
    except (OSError, ValueError) as exc:
        raise RunStateError(f"{path.name}: {CHECKSUMS} is unreadable ({exc})") from None
    actual = _checksums(path)
    for name, digest in expected.items():
        if name not in actual:
            raise RunStateError(f"{path.name}: {name} is missing")
        if actual[name] != digest:
            raise RunStateError(f"{path.name}: {name} does not match its checksum (corrupt)")


def checkpoints_newest_first(save_dir: str | Path) -> list[Path]:
    """The step folders of ``save_dir``, highest step first."""
    return sorted((p for p in Path(save_dir).glob("step_*") if p.is_dir()), reverse=True)


def latest_checkpoint(save_dir: str | Path) -> Path | None:
    """The folder ``latest`` points at, or None when there is no checkpoint yet."""
    pointer = Path(save_dir) / "latest"
    if not pointer.is_file():
        return None
    path = Path(save_dir) / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise RunStateError(f"{pointer} points at {path}, which has no state.json")
    return path


def load_checkpoint(path: str | Path) -> tuple[RunState, list[Trajectory]]:
    """Read a checkpoint's state and buffer (the trainer loads ``path/trainer`` itself)."""
    path = Path(path)
    try:
        raw = json.loads((path / "state.json").read_text())
        state = RunState(**raw)
        lines = (path / "buffer.jsonl").read_text().splitlines()
        buffer = [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]
    except (OSError, ValueError, TypeError) as exc:
        raise RunStateError(f"cannot read the run checkpoint {path}: {exc}") from None
    if state.python_rng is not None:
        version, internal, gauss = state.python_rng
        random.setstate((version, tuple(internal), gauss))
    return state, buffer


def prune_checkpoints(save_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step folders (never the one ``latest`` names), and
    the partial folders of saves a killed driver left behind."""
    save_dir = Path(save_dir)
    for partial in save_dir.glob(".tmp_step_*"):
        if not partial.name.endswith(f"_{os.getpid()}"):  # one driver per output folder
            shutil.rmtree(partial, ignore_errors=True)
    latest = latest_checkpoint(save_dir)
    steps = sorted(p for p in save_dir.glob("step_*") if p.is_dir())
    for p in steps[:-keep] if keep > 0 else []:
        if latest is None or p.resolve() != latest.resolve():
            shutil.rmtree(p, ignore_errors=True)
