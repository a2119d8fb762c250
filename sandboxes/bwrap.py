"""The bubblewrap command line of the ``local`` backend: which host paths a sandbox sees, which
namespaces it gets, and the rlimits (through ``vime-sandbox-launch`` or ``prlimit``) its command
runs under."""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import stat
import sysconfig
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from vime.sandboxes.base import SandboxError, SandboxLimits

WORKDIR = "/work"  # where the sandbox's private work dir appears inside
LAUNCHER = "vime-sandbox-launch"  # see launcher.c
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Host files under /etc that programs need (dynamic linker cache, user names, time zone,
# Debian's alternatives symlinks, Python's site config); everything else in /etc stays hidden.
_ETC = [
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
]
_ROOT_DIRS = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; Fedora: dnf install "
    "bubblewrap), or pass allow_unisolated=True to run without isolation (not safe for "
    "untrusted code)"
)


def find_tool(name: str) -> str:
    """Absolute path of the host program ``name``, or a SandboxError saying how to get it."""
    path = shutil.which(name, path=PATH)
    if path is None:
        hint = INSTALL_HINT if name == "bwrap" else f"install util-linux (it provides {name})"
        raise SandboxError(f"{name!r} was not found on {PATH}: {hint}")
    return path


def find_launcher() -> str | None:
    """``vime-sandbox-launch`` (built from ``launcher.c`` by scripts/install.sh) in this
    environment's scripts directory, or None where it was not built."""
    path = os.path.join(sysconfig.get_path("scripts"), LAUNCHER)
    return path if os.access(path, os.X_OK) else None


def _etc_paths() -> list[str]:
    return _ETC + sorted(glob.glob("/etc/python3*"))


@functools.cache
def _root_layout(etc: str | None) -> tuple[str, ...]:
    """Read-only binds of /usr and the top-level program dirs, mirroring the host's layout,
    and of /etc: the snapshot dir ``etc`` in one bind, or else each file of ``_ETC``."""
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _ROOT_DIRS:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if etc is not None:
        return (*args, "--ro-bind", etc, "/etc")
    for path in _etc_paths():
        args += ["--ro-bind-try", path, path]
    return tuple(args)


def _world_readable(path: str) -> bool:
    info = os.lstat(path)
    return stat.S_ISLNK(info.st_mode) or bool(info.st_mode & stat.S_IROTH)


@functools.cache
def etc_snapshot(root: Path) -> str:
    """A directory under ``root`` holding a copy of the world-readable ``_ETC`` files, bound
    at /etc in one mount: a dozen bind mounts per call cost about 3 ms, a third of bwrap's
    set-up. Named by a hash of what it holds, made once per process (a change of those /etc
    files shows in processes started after it), shared by processes, never written after."""
    sources = [p for p in _etc_paths() if os.path.lexists(p) and _world_readable(p)]
    digest = hashlib.sha256()
    for path in sources:
        for dirpath, dirnames, filenames in (
            os.walk(path) if os.path.isdir(path) else [("", [], [path])]
        ):
            dirnames.sort()
            for name in sorted(
                filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            ):
                full = os.path.join(dirpath, name)
                digest.update(full.encode() + b"\0")
                if os.path.islink(full):
                    digest.update(b"L" + os.readlink(full).encode())
                elif _world_readable(full):
                    digest.update(b"F" + Path(full).read_bytes())
    final = root / f"etc-{digest.hexdigest()[:20]}"
    if final.is_dir():
        return str(final)
    building = Path(tempfile.mkdtemp(prefix="etc-building-", dir=root))
    try:
        building.chmod(0o755)
        for path in sources:
            target = building / os.path.relpath(path, "/etc")
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.copytree(path, target, symlinks=True, ignore=_unreadable)
            else:
                shutil.copy2(path, target, follow_symlinks=False)
        os.rename(building, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already when renamed
    return str(final)


def _unreadable(directory: str, names: list[str]) -> list[str]:
    return [n for n in names if not _world_readable(os.path.join(directory, n))]


def base_env(home: str) -> dict[str, str]:
    """The environment a sandboxed command starts with (nothing of the host's leaks in)."""
    return {"PATH": PATH, "HOME": home, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}


def rlimit_argv(tool: Sequence[str], limits: SandboxLimits) -> list[str]:
    """``tool`` (``prlimit`` or the launcher, which take the same flags) with the flags that
    apply ``limits`` (soft = hard) to the command it execs, up to its ``--``.

    RLIMIT_CPU gets a hard limit one second above the soft one so the command first sees
    SIGXCPU; RLIMIT_CORE is 0 so crashes leave no core files in the work dir.
    """
    cpu = int(limits.cpu_seconds)
    return [
        *tool,
        f"--cpu={cpu}:{cpu + 1}",
        f"--as={int(limits.memory_bytes)}",
        f"--nproc={int(limits.max_processes)}",
        f"--fsize={int(limits.max_file_bytes)}",
        f"--nofile={int(limits.max_open_files)}",
        "--core=0",
        "--",
    ]


def bwrap_prefix(
    bwrap: str,
    *,
    workdir: str,
    limits: SandboxLimits,
    uid: int,
    ro_binds: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    etc: str | None = None,
) -> list[str]:
    """The bwrap arguments of one sandbox, up to (not including) its per-call environment.

    New user, PID, IPC, UTS, cgroup and (unless ``limits.network``) network namespaces; a
    read-only root holding /usr and a few /etc files; ``workdir`` bound read-write at /work;
    fresh /tmp, /proc and /dev; every process runs as ``uid`` in its own session and dies with
    bwrap's parent.
    """
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(uid),
        "--gid",
        str(uid),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        *_root_layout(etc),
    ]
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # Both memory-backed writable places are capped so files cannot exhaust host memory.
        "--size",
        str(int(limits.max_file_bytes)),
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(int(limits.max_file_bytes)),
        "--tmpfs",
        "/tmp",
        "--bind",
        workdir,
        WORKDIR,
        "--chdir",
        WORKDIR,
        "--remount-ro",
        "/",
        "--clearenv",
    ]
    if limits.network:
        args.append("--share-net")
    for key, value in {**base_env(WORKDIR), **(env or {})}.items():
        args += ["--setenv", key, value]
    return args
