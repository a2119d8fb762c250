"""The host side of a ``local`` sandbox's work dir: a size-capped tmpfs (when the caller may
mount one), and file access that never leaves it, never follows a link and never blocks.

Sandboxed code owns the work dir and can change it while the host reads or writes it (swap a
directory for a symlink, leave a FIFO). So every path is walked one component at a time from a
descriptor of the work dir, each component opened relative to the previous one with
``O_NOFOLLOW`` (the walk cannot be redirected out of the tree, whatever is swapped meanwhile),
``..`` is refused, and the last component is opened with ``O_NONBLOCK`` and must be a regular
file. These functions block on disk I/O only; callers run them in a thread.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from vime.sandboxes.base import SandboxError

logger = logging.getLogger(__name__)

DEFAULT_WORK_BYTES = 256 << 20  # as the docker backend's /work
BYTES_PER_INODE = 4096  # the inode cap of a work dir: one file per 4 KiB of its size
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)


def inodes(size: int) -> int:
    """The inode (file count) cap of a work dir of ``size`` bytes."""
    return max(1024, size // BYTES_PER_INODE)


def mount_tmpfs(path: Path, *, size: int, uid: int) -> str | None:
    """Mount a tmpfs of ``size`` bytes (and :func:`inodes` files) owned by ``uid`` on
    ``path``; returns None, or why it could not (mounting needs CAP_SYS_ADMIN)."""
    options = f"size={size},nr_inodes={inodes(size)},mode=0700,uid={uid},gid={uid}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def remove(path: Path) -> None:
    """Unmount ``path`` if it is a mount point, then delete it and what it holds."""
    if os.path.ismount(path) and _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
        logger.error("could not unmount work dir %s: %s", path, os.strerror(ctypes.get_errno()))
    shutil.rmtree(path, ignore_errors=True)


def parts(path: str, workdir: str) -> list[str]:
    """The components of ``path`` (relative, or absolute under ``workdir`` as the sandbox sees
    it); an absolute path elsewhere, ``..`` or an empty path is a SandboxError."""
    pure = PurePosixPath(path)
    if pure.is_absolute() and pure.is_relative_to(workdir):
        pure = pure.relative_to(workdir)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise SandboxError(
            f"path {path!r} is outside the sandbox work dir; use a path relative to it"
        )
    return list(pure.parts)


class _NotRegular(Exception):
    """The path names something other than a regular file (a directory, a FIFO, ...)."""


_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}


def _fail(exc: Exception, path: str, sandbox: str) -> Exception:
    """The error for the caller, naming the sandbox's path, never the host's."""
    where = f"{path!r} in sandbox {sandbox}"
    if isinstance(exc, _NotRegular):
        return SandboxError(f"{where} is {exc}, not a regular file; it is not read or written")
    assert isinstance(exc, OSError)
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(f"no file {where}")
    if exc.errno == errno.EISDIR:
        return SandboxError(f"{where} is a directory, not a regular file")
    if exc.errno == errno.ENXIO:  # opening a FIFO without a reader, or a socket
        return SandboxError(f"{where} is a FIFO or socket, not a regular file")
    if exc.errno == errno.ELOOP:
        return SandboxError(f"{where} goes through a symbolic link; links are not followed")
    if exc.errno == errno.ENOTDIR:
        return SandboxError(
            f"{where}: a parent of it is not a directory (symbolic links are not followed)"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxError(f"{where}: the work dir is full (out of space or inodes)")
    return SandboxError(f"{where}: {os.strerror(exc.errno or 0)}")


def _walk(root: Path, names: list[str], *, create: bool, uid: int | None) -> int:
    """A descriptor of the directory ``root/names...``, opened one component at a time without
    following links; with ``create``, missing directories are made (owned by ``uid``)."""
    fd = os.open(root, _DIR)
    try:
        for name in names:
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:  # made meanwhile: open whatever is there now
                    pass
                child = os.open(name, _DIR, dir_fd=fd)
                if uid is not None:
                    os.fchown(child, uid, uid)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular(root: Path, names: list[str], flags: int, uid: int | None) -> int:
    """A descriptor of the regular file ``names`` under ``root`` (see the module's doc)."""
    parent = _walk(root, names[:-1], create=bool(flags & os.O_CREAT), uid=uid)
    try:
        # O_NONBLOCK: opening a FIFO returns at once (or fails) instead of waiting for a peer.
        flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(names[-1], flags, 0o644, dir_fd=parent)
    finally:
        os.close(parent)
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        raise _NotRegular(_KINDS.get(kind, "a special file"))
    return fd


def write(
    root: Path, path: str, names: list[str], data: bytes, *, uid: int | None, sandbox: str
) -> None:
    """Write ``data`` to the regular file ``names`` under ``root`` (made, with its missing
    directories, and owned by ``uid``); ``path`` and ``sandbox`` name it in errors."""
    try:
        fd = _open_regular(root, names, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, uid)
        try:
            if uid is not None:
                os.fchown(fd, uid, uid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except (OSError, _NotRegular) as exc:
        raise _fail(exc, path, sandbox) from None


def read(root: Path, path: str, names: list[str], *, sandbox: str) -> bytes:
    """The bytes of the regular file ``names`` under ``root``."""
    try:
        with os.fdopen(_open_regular(root, names, os.O_RDONLY, None), "rb") as f:
            return f.read()
    except (OSError, _NotRegular) as exc:
        raise _fail(exc, path, sandbox) from None
