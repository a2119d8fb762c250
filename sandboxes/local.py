"""The ``local`` backend: each call runs under bubblewrap in fresh namespaces, as an unprivileged
user, with rlimits, over a private work dir that lives as long as the sandbox."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import signal
import tempfile
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vime.sandboxes import bwrap, seccomp, workdir
from vime.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits, shell_argv
from vime.sandboxes.process import (
    MARKER_VAR,
    kill_marked,
    kill_orphans,
    marker,
    pid_alive,
    run_process,
)

logger = logging.getLogger(__name__)

NOBODY = 65534
UNISOLATED_WARNING = (
    "vime.sandboxes local backend is running WITHOUT ISOLATION (allow_unisolated=True, no "
    "bubblewrap): model-written code can read and write your files, use the network and, as "
    "root, fork without limit. Only rlimits apply. Install bubblewrap for real isolation."
)
_probed: dict[bool, str | None] = {}  # network on? -> bwrap's error text, or None if it works
_reaped: set[Path] = set()  # work dir roots already cleaned of dead processes' leftovers
_uncapped_warned = False
_fallback_noted = False


def _note_fallback() -> None:
    global _fallback_noted
    if not _fallback_noted:
        _fallback_noted = True
        logger.info(
            "%s is not built (scripts/install.sh builds it when a C compiler exists): local "
            "sandboxes use setpriv and prlimit, about 1.7 ms more per call",
            bwrap.LAUNCHER,
        )


def reap_orphans(root: Path) -> list[Path]:
    """Clean up after owner processes that died without closing their sandboxes.

    Kills sandboxed processes whose owner is gone (see :func:`kill_orphans`), then deletes
    the work dirs in ``root`` (named ``<owner pid>-<random>``) of owners that are gone.
    Returns the deleted work dirs.
    """
    killed = kill_orphans()
    if killed:
        logger.warning("killed %d sandboxed processes whose owner is gone", len(killed))
    removed = []
    for path in root.iterdir():
        owner, _, _ = path.name.partition("-")
        if owner.isdigit() and int(owner) != os.getpid() and not pid_alive(int(owner)):
            workdir.remove(path)
            removed.append(path)
    return removed


def _workdir_root(parent: str | None, uid: int | None) -> Path:
    """A directory for sandbox work dirs that the sandbox user (``uid``, None when it is the
    caller) can traverse but not list; the first use in a process reaps what dead processes
    left there."""
    root = Path(parent or tempfile.gettempdir()).resolve() / f"vime-sandboxes-{os.geteuid()}"
    root.mkdir(mode=0o711, exist_ok=True)
    for directory in [root, *root.parents] if uid is not None else []:
        info = directory.stat()
        if info.st_uid != uid and not info.st_mode & 0o001:
            raise SandboxError(
                f"the sandbox user (uid {uid}) cannot reach work dirs under {root}: {directory} "
                "is not searchable by others; pass workdir_parent= a directory whose parents "
                "all have the o+x bit, or chmod o+x it"
            )
    if root not in _reaped:
        _reaped.add(root)
        for path in reap_orphans(root):
            logger.info("removed the work dir %s of a process that is gone", path)
    return root


class LocalSandbox(Sandbox):
    """Runs commands on this machine under bubblewrap, one fresh set of namespaces per call.

    Isolation: no network, a read-only view of /usr and a few /etc files, a private writable
    work dir at ``/work`` (kept between calls of this sandbox, deleted by :meth:`close`), a
    private /tmp, a new PID namespace (so no process outlives its call), and the limits in
    :class:`SandboxLimits` applied with rlimits. When the caller is root the commands run as
    ``uid`` (default 65534, "nobody") so that the process limit holds.

    Options: ``limits`` or keyword overrides of them (``timeout=5``, ``memory_bytes=...``);
    ``ro_binds`` (host paths to show read-only, e.g. a virtualenv); ``env`` (extra variables);
    ``workdir_parent`` (where work dirs are made); ``work_bytes`` (the size of the work dir, a
    tmpfs with one inode per 4 KiB, when the caller may mount one, i.e. is root; otherwise a
    warning says the work dir is not capped); ``allow_unisolated`` (run with rlimits only when
    bubblewrap is missing, with a loud warning).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        allow_unisolated: bool = False,
        ro_binds: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        workdir_parent: str | None = None,
        work_bytes: int = workdir.DEFAULT_WORK_BYTES,
        uid: int = NOBODY,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(SandboxLimits.resolve(limits, **limit_overrides))
        self.id = uuid.uuid4().hex[:16]
        self.isolated = shutil.which("bwrap", path=bwrap.PATH) is not None
        if not self.isolated and not allow_unisolated:
            raise SandboxError(
                f"the local sandbox needs bubblewrap ('bwrap'): {bwrap.INSTALL_HINT}"
            )
        for path in ro_binds:
            if not os.path.isabs(path) or not os.path.exists(path):
                raise SandboxError(f"ro_binds entry {path!r} must be an existing absolute path")
        self._launcher = bwrap.find_launcher()
        if self._launcher is None:
            _note_fallback()
        self._limiter = [self._launcher or bwrap.find_tool("prlimit")]
        self._switch_user = os.geteuid() == 0
        self._uid = uid if self._switch_user else os.geteuid()
        self._env = dict(env or {})
        self._ro_binds = list(ro_binds)
        self._workdir_parent = workdir_parent
        if isinstance(work_bytes, bool) or not isinstance(work_bytes, int) or work_bytes <= 0:
            raise ValueError(
                f"local sandbox option work_bytes must be positive, got {work_bytes!r}"
            )
        self.work_bytes = work_bytes
        self.workdir: Path | None = None
        self._prefix: list[str] = []
        self._calls = itertools.count(1)
        self._running: set[asyncio.subprocess.Process] = set()
        if not self.isolated:
            logger.warning(UNISOLATED_WARNING)
            warnings.warn(UNISOLATED_WARNING, RuntimeWarning, stacklevel=2)

    async def start(self) -> None:
        """Create the work dir and, once per process, check that bubblewrap works here."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} is closed; create a new one")
        if self.workdir is not None:
            return
        path = Path(
            tempfile.mkdtemp(
                prefix=f"{os.getpid()}-",
                dir=_workdir_root(self._workdir_parent, self._uid if self._switch_user else None),
            )
        )
        self.workdir = path
        self._cap_workdir(path)
        if self._switch_user:
            os.chown(path, self._uid, self._uid)
        if self.isolated:
            # An exec that switches user, not Popen(user=...): the switch then happens after a
            # vfork+exec, so each call costs the same however large this (trainer or env
            # worker) process is. vime-sandbox-launch (launcher.c) where it was built: one
            # small exec here and one inside instead of util-linux's setpriv and prlimit, about
            # 1.7 ms less per call, a quarter of what local adds to a bare subprocess.
            if self._launcher is not None:
                switch = [self._launcher, f"--uid={self._uid}", f"--gid={self._uid}", "--"]
            else:
                switch = [
                    bwrap.find_tool("setpriv"),
                    f"--reuid={self._uid}",
                    f"--regid={self._uid}",
                    "--clear-groups",
                    "--",
                ]
            self._prefix = [
                *(switch if self._switch_user else []),
                *bwrap.bwrap_prefix(
                    bwrap.find_tool("bwrap"),
                    workdir=str(path),
                    limits=self.limits,
                    uid=self._uid,
                    ro_binds=self._ro_binds,
                    env=self._env,
                    etc=await asyncio.to_thread(bwrap.etc_snapshot, path.parent),
                ),
            ]
            await self._probe()

    def _cap_workdir(self, path: Path) -> None:
        """Make the work dir a tmpfs of ``work_bytes``, or warn (once) that it cannot be."""
        global _uncapped_warned
        why = workdir.mount_tmpfs(path, size=self.work_bytes, uid=self._uid)
        if why is not None and not _uncapped_warned:
            _uncapped_warned = True
            logger.warning(
                "local sandbox work dirs are NOT size-capped: mounting a tmpfs failed (%s; it "
                "needs root). Sandboxed code can fill the disk under %s; run as root or use "
                "the docker backend.",
                why,
                path.parent,
            )

    async def _probe(self) -> None:
        """Fail early, with bwrap's own words, where namespaces are not allowed."""
        key = self.limits.network
        if key not in _probed:
            result = await self._exec(["true"], timeout=30.0, stdin=None)
            _probed[key] = (
                None if result.ok else (result.stderr.strip() or f"exit {result.exit_code}")
            )
        if _probed[key] is not None:
            raise SandboxError(
                f"bubblewrap cannot create a sandbox here: {_probed[key]}. It needs user "
                "namespaces: check `sysctl kernel.unprivileged_userns_clone` (must be 1) and, on "
                "Ubuntu 24.04+, `kernel.apparmor_restrict_unprivileged_userns` (must be 0); in a "
                "container, run it with --privileged or a seccomp profile allowing unshare."
            )

    def _argv(self, argv: list[str], call: str, filter_fd: int, launch_fd: int = -1) -> list[str]:
        # The rlimits are set inside bwrap, on the command only. RLIMIT_NPROC in particular
        # cannot be set before bwrap: the kernel then charges it, through the sandbox's user
        # namespace, against every process of the sandbox uid on the host, so a few concurrent
        # sandboxes would exhaust it (bwrap fails with EAGAIN). The launcher is executed from a
        # descriptor (its host path is not mounted inside; a bind mount per call costs ~1 ms).
        limiter = self._limiter
        if launch_fd >= 0:
            limiter = [f"/proc/self/fd/{launch_fd}", f"--close-fd={launch_fd}"]
        limited = [*bwrap.rlimit_argv(limiter, self.limits), *argv]
        if self.isolated:
            seccomp_args = ["--seccomp", str(filter_fd)]
            return [*self._prefix, *seccomp_args, "--setenv", MARKER_VAR, call, *limited]
        return limited

    async def _exec(self, argv: list[str], *, timeout: float, stdin: bytes | None) -> ExecResult:
        assert self.workdir is not None
        call = marker(self.id, next(self._calls))
        popen: dict[str, Any] = {}
        filter_fd = launch_fd = -1
        try:
            if self.isolated:
                # bwrap is PID 1 inside, readable by the sandboxed code (/proc/1/environ): it
                # gets an empty environment so that no host secret reaches it.
                filter_fd = seccomp.pipe()
                if self._launcher is not None:
                    # Opened per call, like the filter: nothing to go stale in a long-lived
                    # process, and bwrap's PID 1 closes it inside.
                    launch_fd = os.open(self._launcher, os.O_RDONLY | os.O_CLOEXEC)
                fds = (filter_fd, launch_fd) if launch_fd >= 0 else (filter_fd,)
                popen.update(env={}, pass_fds=fds)
            else:
                env = {**bwrap.base_env(str(self.workdir)), **self._env, MARKER_VAR: call}
                popen.update(cwd=self.workdir, env=env)
            return await run_process(
                self._argv(argv, call, filter_fd, launch_fd),
                timeout=timeout,
                stdin=stdin,
                max_output_bytes=self.limits.max_output_bytes,
                cleanup=lambda: kill_marked(call),
                track=self._running,
                **popen,
            )
        finally:
            for fd in (filter_fd, launch_fd):
                if fd >= 0:
                    os.close(fd)

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a shell command line (str) or an argv list in ``/work``.

        A command killed by signal N exits 128+N, as in a shell; a timeout gives
        ``timed_out=True`` and exit code -9 after the whole process tree is gone.
        """
        await self.start()
        limit = self.limits.timeout if timeout is None else timeout
        if limit <= 0:
            raise ValueError(f"timeout must be positive, got {limit!r}")
        for path, content in (files or {}).items():
            await self.write_file(path, content)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._exec(shell_argv(command), timeout=limit, stdin=data)

    def _root(self) -> Path:
        if self.workdir is None:
            raise SandboxError(f"sandbox {self.id} is closed; create a new one")
        return self.workdir

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Write ``content`` to ``path`` (relative to the work dir, or under /work).

        Refuses links and non-regular files (see :mod:`vime.sandboxes.workdir`); runs in a
        thread so the event loop never waits on the disk.
        """
        await self.start()
        names = workdir.parts(path, bwrap.WORKDIR)
        data = content.encode() if isinstance(content, str) else content
        uid = self._uid if self._switch_user else None
        await asyncio.to_thread(
            workdir.write, self._root(), path, names, data, uid=uid, sandbox=self.id
        )

    async def read_file(self, path: str) -> bytes:
        """The bytes of the regular file ``path`` (relative to the work dir, or under /work)."""
        await self.start()
        names = workdir.parts(path, bwrap.WORKDIR)
        return await asyncio.to_thread(workdir.read, self._root(), path, names, sandbox=self.id)

    async def close(self) -> None:
        """Kill every running call and its processes, then delete the work dir. Idempotent."""
        if self.closed:
            return
        self.closed = True
        running = list(self._running)
        for proc in running:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # Under bubblewrap nothing outlives its call, so only killed calls need the /proc scan.
        if running or not self.isolated:
            left = await kill_marked(marker(self.id))
            if left:
                logger.error("sandbox %s: processes %s survived SIGKILL", self.id, left)
        if self.workdir is not None:
            workdir.remove(self.workdir)
            self.workdir = None
