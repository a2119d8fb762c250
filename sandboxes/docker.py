"""The ``docker`` backend: one container per sandbox (no network, read-only root, a tmpfs work
dir, memory/pids/CPU limits) and one ``docker exec`` per call, through the docker SDK."""

from __future__ import annotations

import asyncio
import atexit
import functools
import io
import itertools
import logging
import os
import re
import socket
import struct
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath
from typing import Any, TypeVar

from vime.sandboxes import seccomp, workdir
from vime.sandboxes.base import ExecResult, Sandbox, SandboxError, SandboxLimits, shell_argv

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "vime-sandbox:bookworm"
WORKDIR = "/work"
LABEL = "vime.sandbox"  # "1" on every container and volume this backend makes
OWNER_LABEL = "vime.owner"  # "<host>:<pid>:<process start time>" of the creating process
MARKER_VAR = "VIME_SANDBOX"  # in every call's environment: "<sandbox id>/<call number>"
ENGINE_HINT = (
    "start dockerd: `dockerd --bridge=none --iptables=false &` as root (or run "
    ".ci/docker_setup.sh), or point DOCKER_HOST at a running engine"
)
IMAGE_HINT = "build it with .ci/docker_setup.sh, or pass image=... naming an image that has python3"

_GRACE = 1.0  # seconds past a call's timeout before the client kills its processes itself
# Seconds to wait for the output to end after that kill. Generous: on a loaded machine the
# engine may deliver a finished command's last output seconds after it reports the exit.
_DRAIN = 5.0
_POLL = 0.1  # how often a blocked read wakes up to look at the deadline and cancellation
# While the output is idle, ask whether the command exited after 0.5 s, then at doubling
# intervals up to 4 s: a busy engine must not be flooded with inspects by many slow calls.
_FIRST_CHECK = 0.5
_MAX_CHECK = 4.0
_PIPE_GRACE = 0.5  # seconds the output may stay open after the command exited
OOM_NOTE = "vime-sandbox: killed by the kernel: out of memory"
_FILES_FAILED = "vime-sandbox: writing the call's files failed"
_TAR_FAILED_EXIT = 125
# Files for a call travel in the same exec as the call, as a tar stream in front of stdin:
# one exec instead of two. `head -c` reads exactly the archive, leaving stdin to the command.
_WRAPPER = (
    f'if [ "$1" -gt 0 ]; then head -c "$1" | tar -x -m -f - '
    f'|| {{ echo "{_FILES_FAILED}" >&2; exit {_TAR_FAILED_EXIT}; }}; fi; '
    't=$2; shift 2; exec timeout -s KILL "$t" "$@"'
)
# SIGKILL every process of the sandbox user but this shell (PID 1 runs as another user), until
# none is left: a call's processes may have dropped the marker (a re-exec with an empty env).
_KILL_ALL = (
    'n=0; while [ "$n" -lt 50 ]; do kill -9 -1 2>/dev/null || exit 0; n=$((n + 1)); done; exit 1'
)
# SIGKILL every process whose environment holds the marker, until none is left.
_KILL_MARKED = (
    'm="$1"; n=0; while [ "$n" -lt 50 ]; do found=; '
    "for d in /proc/[0-9]*; do "
    'if grep -qzxF -- "$m" "$d/environ" 2>/dev/null; then '
    'kill -9 "${d#/proc/}" 2>/dev/null; found=1; fi; done; '
    '[ -z "$found" ] && exit 0; n=$((n + 1)); done; exit 1'
)

T = TypeVar("T")
_lock = threading.Lock()
_client: Any = None
_pool: ThreadPoolExecutor | None = None
_reaped = False
_live: dict[str, DockerSandbox] = {}  # container id -> sandbox, for the exit handler


def _forget_parent_state() -> None:
    """In a forked child: its own client, threads and owner tag; the parent's sandboxes are
    the parent's to close."""
    global _lock, _client, _pool
    _lock, _client, _pool = threading.Lock(), None, None
    _live.clear()
    owner_tag.cache_clear()


def _start_time(pid: int) -> str | None:
    """The start time (clock ticks after boot) of ``pid``, which tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


@functools.cache
def owner_tag() -> str:
    """This process's owner label value."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


os.register_at_fork(after_in_child=_forget_parent_state)


def _owner_dead(tag: str) -> bool:
    """True when ``tag`` names a process of this host that no longer runs."""
    host, _, rest = tag.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's sandbox: not ours to judge
    return _start_time(int(pid)) != started


def _executor() -> ThreadPoolExecutor:
    """The threads that run the blocking docker SDK calls; a call holds one while it runs."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix="vime-docker")
        return _pool


def api() -> Any:
    """The process's low-level docker client (``docker.APIClient``), connected on first use."""
    global _client
    with _lock:
        if _client is None:
            import docker

            try:
                client = docker.from_env(max_pool_size=256)
                client.ping()
            except docker.errors.DockerException as exc:
                raise SandboxError(f"no Docker engine answers ({exc}); {ENGINE_HINT}") from exc
            _client = client.api
            atexit.register(_close_all)
        return _client


def engine_error() -> str | None:
    """Why no Docker engine can be used from here (with what to do), or None when one answers."""
    try:
        api()
    except SandboxError as exc:
        return str(exc)
    return None


async def _offload(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_executor(), fn, *args)


def reap_orphans() -> list[str]:
    """Remove sandbox containers and volumes whose owner process on this host has died.

    Returns the ids removed. Sandboxes of live processes and of other hosts are left alone.
    """
    import docker

    client = api()
    removed = []
    for container in client.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if _owner_dead(container["Labels"].get(OWNER_LABEL, "")):
            try:
                client.remove_container(container["Id"], force=True)
                removed.append(container["Id"])
            except docker.errors.NotFound:
                pass  # reaped by someone else meanwhile
    for volume in client.volumes(filters={"label": f"{LABEL}=1"}).get("Volumes") or []:
        if _owner_dead((volume.get("Labels") or {}).get(OWNER_LABEL, "")):
            try:
                client.remove_volume(volume["Name"], force=True)
                removed.append(volume["Name"])
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:  # still in use by a live container
                logger.warning("could not remove sandbox volume %s: %s", volume["Name"], exc)
    if removed:
        logger.warning("removed %d orphaned docker sandbox objects", len(removed))
    return removed


def _close_all() -> None:
    """At interpreter exit: remove the containers of sandboxes nobody closed."""
    for sandbox in list(_live.values()):
        sandbox._remove()


def _relative(path: str) -> str:
    """``path`` relative to the work dir (given relative, or absolute under /work)."""
    pure = PurePosixPath(path)
    if pure.is_absolute() and pure.is_relative_to(WORKDIR):
        pure = pure.relative_to(WORKDIR)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise SandboxError(
            f"path {path!r} is outside the sandbox work dir; use a path relative to it"
        )
    return str(pure)


def _init_user(uid: str) -> str:
    """The user of the container's PID 1: any other than the calls' ``uid``."""
    other = "65533" if uid != "65533" else "65532"
    return f"{other}:{other}"


def _tar(files: Mapping[str, str | bytes]) -> bytes:
    """An uncompressed tar of ``files`` (paths relative to the work dir)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for path, content in files.items():
            data = content.encode() if isinstance(content, str) else bytes(content)
            info = tarfile.TarInfo(_relative(path))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class _Capture:
    """The first ``cap`` bytes of a stream, and whether more came."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.dropped = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _Frames:
    """Docker's multiplexed output of one exec, split into its stdout and stderr.

    Each frame is an 8-byte header (stream 1 = stdout, 2 = stderr; big-endian length)
    followed by its payload. A frame cut between two reads waits here for its rest.
    """

    def __init__(self, cap: int) -> None:
        self.out, self.err = _Capture(cap), _Capture(cap)
        self.pending = b""

    def feed(self, chunk: bytes) -> None:
        buffer = self.pending + chunk
        while len(buffer) >= 8:
            size = struct.unpack(">I", buffer[4:8])[0]
            if len(buffer) < 8 + size:
                break
            (self.out if buffer[0] == 1 else self.err).add(buffer[8 : 8 + size])
            buffer = buffer[8 + size :]
        self.pending = buffer


class DockerSandbox(Sandbox):
    """A Docker container for one episode; every call is a ``docker exec`` into it.

    The container runs ``image`` with no network (unless ``limits.network``), a read-only
    root, a tmpfs work dir at ``/work`` of ``work_bytes`` and a tmpfs ``/tmp``, all
    capabilities dropped, as ``user`` (numeric ``uid[:gid]``, default 65534, "nobody"). Memory (no swap) and the
    process count are limits of the whole container; CPU time, file size and open files are
    rlimits of each process; ``cpus`` caps its CPU share. A call's wall-clock timeout kills
    its whole process tree. Background processes that still hold a call's output when it
    exits are killed then; detached ones (output redirected) keep running until
    :meth:`close`, which removes the container. Containers are labelled with their owner
    process; those of dead owners are removed when a process starts its first sandbox.

    The container's PID 1 (docker-init) runs as another user than the calls, so they can
    neither signal it nor write into its output (the container log, which is off anyway); a
    seccomp profile denies the syscalls of :mod:`vime.sandboxes.seccomp`. A call's kill (at a
    timeout, on cancel, or when leftovers hold its output) takes every process of the sandbox
    user when no other call of the sandbox is running, and the call's marked processes
    otherwise.

    Options: ``limits`` or keyword overrides of them (``timeout=5``); ``image``; ``user``;
    ``cpus``; ``work_bytes``; ``tmp_bytes``; ``env`` (extra variables); ``runtime`` (an OCI
    runtime registered with the engine, e.g. "runsc" for gVisor; default: the engine's).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        user: str = "65534:65534",
        cpus: float = 1.0,
        work_bytes: int = 256 << 20,
        tmp_bytes: int = 64 << 20,
        env: Mapping[str, str] | None = None,
        runtime: str | None = None,
        **limit_overrides: Any,
    ) -> None:
        super().__init__(SandboxLimits.resolve(limits, **limit_overrides))
        for name, value in {"cpus": cpus, "work_bytes": work_bytes, "tmp_bytes": tmp_bytes}.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"docker sandbox option {name} must be positive, got {value!r}")
        if not re.fullmatch(r"\d+(:\d+)?", user):
            raise ValueError(
                f"docker sandbox user must be numeric 'uid' or 'uid:gid', got {user!r}"
            )
        self.id = uuid.uuid4().hex[:16]
        self.image = image
        self.user = user
        self.cpus = float(cpus)
        self.work_bytes = int(work_bytes)
        self.tmp_bytes = int(tmp_bytes)
        self.runtime = runtime
        self.env = {"HOME": WORKDIR, "TMPDIR": "/tmp", "LANG": "C.UTF-8", **(env or {})}
        self.container_id: str | None = None
        self._volume: str | None = None
        self._calls = itertools.count(1)
        self._oom_kills = 0  # the container's OOM kill count when last read
        self._in_flight = 0  # calls running now (their threads change it under _lock)
        self._start_lock = asyncio.Lock()

    # ---- lifetime -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create and start the container (and reap orphans once per process); idempotent."""
        if self.container_id is not None and not self.closed:
            return
        async with self._start_lock:
            if self.closed:
                raise SandboxError(f"sandbox {self.id} is closed; create a new one")
            if self.container_id is None:
                await _offload(self._create)

    def _labels(self) -> dict[str, str]:
        return {LABEL: "1", OWNER_LABEL: owner_tag(), "vime.sandbox.id": self.id}

    def _create(self) -> None:
        import docker

        global _reaped
        client = api()
        with _lock:
            reap, _reaped = not _reaped, True
        if reap:
            try:
                reap_orphans()
            except docker.errors.APIError as exc:  # not a reason to fail this sandbox
                logger.warning("could not reap orphaned docker sandboxes: %s", exc)
        try:
            self._create_container(client)
        except docker.errors.ImageNotFound as exc:
            self._remove()
            raise SandboxError(f"docker image {self.image!r} not found; {IMAGE_HINT}") from exc
        except docker.errors.APIError as exc:
            self._remove()
            raise SandboxError(
                f"could not start a sandbox container of {self.image!r}: {exc}"
            ) from exc

    def _create_container(self, client: Any) -> None:
        from docker.types import LogConfig, Mount, Ulimit

        uid, _, gid = self.user.partition(":")
        # The work dir belongs to the sandbox user, so its calls can write there.
        volume = client.create_volume(
            name=f"vime-sbx-{self.id}",
            driver="local",
            driver_opts={
                "type": "tmpfs",
                "device": "tmpfs",
                "o": (
                    f"size={self.work_bytes},nr_inodes={workdir.inodes(self.work_bytes)},"
                    f"mode=0755,uid={uid},gid={gid or uid}"
                ),
            },
            labels=self._labels(),
        )
        self._volume = volume["Name"]
        cpu = int(self.limits.cpu_seconds)
        host_config = client.create_host_config(
            network_mode="bridge" if self.limits.network else "none",
            read_only=True,
            mounts=[Mount(WORKDIR, self._volume, type="volume")],
            tmpfs={"/tmp": f"size={self.tmp_bytes},mode=1777"},
            mem_limit=int(self.limits.memory_bytes),
            memswap_limit=int(self.limits.memory_bytes),  # no swap
            pids_limit=int(self.limits.max_processes),
            nano_cpus=int(self.cpus * 1e9),
            ulimits=[
                Ulimit(name="cpu", soft=cpu, hard=cpu + 1),
                Ulimit(
                    name="fsize", soft=self.limits.max_file_bytes, hard=self.limits.max_file_bytes
                ),
                Ulimit(
                    name="nofile", soft=self.limits.max_open_files, hard=self.limits.max_open_files
                ),
                Ulimit(name="core", soft=0, hard=0),
            ],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges", f"seccomp={seccomp.docker_profile()}"],
            # Nothing reads the container's log; with none there is no file to flood.
            log_config=LogConfig(type=LogConfig.types.NONE),
            init=True,  # an init as pid 1 reaps the zombies that exec'd calls leave behind
            runtime=self.runtime,
        )
        container = client.create_container(
            self.image,
            command=["sleep", "infinity"],
            name=f"vime-sbx-{self.id}",
            hostname="sandbox",
            user=_init_user(uid),
            working_dir=WORKDIR,
            environment=self.env,
            labels=self._labels(),
            host_config=host_config,
        )
        self.container_id = container["Id"]
        _live[self.container_id] = self
        client.start(self.container_id)

    def _remove(self) -> None:
        """Remove the container (killing everything in it) and its work volume."""
        import docker

        client = api()
        container, self.container_id = self.container_id, None
        if container is not None:
            _live.pop(container, None)
            try:
                client.remove_container(container, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:  # e.g. a removal already in progress
                logger.warning("sandbox %s: removing container %s: %s", self.id, container, exc)
        volume, self._volume = self._volume, None
        if volume is not None:
            try:
                client.remove_volume(volume, force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                logger.warning("sandbox %s: removing volume %s: %s", self.id, volume, exc)

    async def close(self) -> None:
        """Remove the container with every process in it, and its work dir. Idempotent."""
        if self.closed:
            return
        self.closed = True
        async with self._start_lock:  # a start in flight finishes first, then is undone
            if self.container_id is not None or self._volume is not None:
                await _offload(self._remove)

    # ---- calls ----------------------------------------------------------------------------

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a shell command line (str) or an argv list in ``/work``.

        A command killed by signal N exits 128+N, as in a shell: a memory hog the kernel
        kills exits 137 with a note saying so at the end of stderr. A timeout gives
        ``timed_out=True`` and exit code -9 after the call's whole process tree is gone.
        """
        limit = self.limits.timeout if timeout is None else timeout
        if limit <= 0:
            raise ValueError(f"timeout must be positive, got {limit!r}")
        archive = _tar(files) if files else b""
        await self.start()
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result = await self._call(shell_argv(command), limit, archive, data)
        if result.exit_code == _TAR_FAILED_EXIT and _FILES_FAILED in result.stderr:
            raise SandboxError(f"could not write files {sorted(files or {})}: {result.stderr}")
        return result

    async def _call(
        self, argv: list[str], limit: float, archive: bytes, stdin: bytes | None
    ) -> ExecResult:
        """One exec, in a worker thread; cancelling it kills the call's processes."""
        cancelled = threading.Event()
        marker = f"{self.id}/{next(self._calls)}"
        future = _executor().submit(self._exec, argv, limit, archive, stdin, marker, cancelled)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def _exec(
        self,
        argv: list[str],
        limit: float,
        archive: bytes,
        stdin: bytes | None,
        marker: str,
        cancelled: threading.Event,
    ) -> ExecResult:
        import docker

        client = api()
        started = time.monotonic()
        # At least 1 ms: `timeout 0` would mean no limit at all.
        command = ["timeout", "-s", "KILL", f"{max(limit, 0.001):.3f}", *argv]
        if archive:
            command = ["sh", "-c", _WRAPPER, "sh", str(len(archive)), *command[3:]]
        payload = archive + (stdin or b"")
        container = self.container_id
        if container is None:
            raise SandboxError(f"sandbox {self.id} is closed; create a new one")
        try:
            exec_id = client.exec_create(
                container,
                command,
                stdin=bool(payload),
                user=self.user,
                environment={MARKER_VAR: marker},
                workdir=WORKDIR,
            )["Id"]
            sock = client.exec_start(exec_id, socket=True)
        except docker.errors.NotFound as exc:
            raise SandboxError(f"sandbox {self.id} is closed; create a new one") from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"docker exec failed in sandbox {self.id}: {exc}") from exc
        raw = getattr(sock, "_sock", sock)
        frames = _Frames(self.limits.max_output_bytes)
        frames.feed(_read_ahead(sock, raw))
        with _lock:
            self._in_flight += 1
        try:
            try:
                if payload:
                    _send_then_close(raw, payload, started + limit + _GRACE)
                outcome = _pump(raw, frames, started + limit + _GRACE, cancelled, exec_id)
                if outcome != "eof":
                    # Kill what is left of the call: on a timeout, everything; after the
                    # command exited, what it left holding its output open (dockerd stalls the
                    # container's next calls for seconds while an exec's output stays open).
                    self._kill_call(marker)
                    _pump(raw, frames, time.monotonic() + _DRAIN, threading.Event(), None)
            finally:
                sock.close()
            duration = time.monotonic() - started
            try:
                code = client.exec_inspect(exec_id)["ExitCode"]
            except docker.errors.NotFound:  # the container went away: closed during the call
                code = None
            timed_out = outcome == "deadline" or (code == 137 and duration >= limit)
            if timed_out and outcome == "eof":
                # `timeout` inside killed the command; what it started and detached is left.
                self._kill_call(marker)
        finally:
            with _lock:
                self._in_flight -= 1
        out, err = frames.out, frames.err
        stderr = err.text()
        if code == 137 and not timed_out and self._new_oom_kill():
            stderr += (
                f"{OOM_NOTE} (the sandbox's memory limit is {self.limits.memory_bytes} bytes)\n"
            )
        return ExecResult(
            stdout=out.text(),
            stderr=stderr,
            exit_code=-9 if timed_out or code is None else code,
            timed_out=timed_out,
            duration=duration,
            truncated=out.dropped or err.dropped,
        )

    def _new_oom_kill(self) -> bool:
        """Whether the kernel OOM-killed a process in the container since the last look."""
        import docker

        # cgroup v1 (memory.oom_control) or v2 (memory.events): a line "oom_kill N".
        command = [
            "sh",
            "-c",
            "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events",
        ]
        try:
            client = api()
            exec_id = client.exec_create(self.container_id, command, stderr=False)["Id"]
            text = client.exec_start(exec_id).decode(errors="replace")
        except docker.errors.APIError:
            return False
        kills = sum(
            int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")
        )
        seen, self._oom_kills = self._oom_kills, max(self._oom_kills, kills)
        return kills > seen

    def _kill_call(self, marker: str) -> None:
        """SIGKILL the processes of one call, including those that left its process group:
        every process of the sandbox user when this call is the only one running, else those
        carrying the call's marker."""
        import docker

        client = api()
        with _lock:
            alone = self._in_flight == 1
        if alone:
            command = ["sh", "-c", _KILL_ALL]
        else:
            command = ["sh", "-c", _KILL_MARKED, "sh", f"{MARKER_VAR}={marker}"]
        try:
            exec_id = client.exec_create(self.container_id, command, user=self.user)["Id"]
            client.exec_start(exec_id)
        except docker.errors.APIError as exc:  # e.g. no pid left to start the killer
            logger.warning("sandbox %s: could not kill call %s: %s", self.id, marker, exc)

    # ---- files ----------------------------------------------------------------------------

    async def write_file(self, path: str, content: str | bytes) -> None:
        """Write ``content`` to ``path`` (relative to the work dir, or under /work)."""
        result = await self.run(["true"], files={path: content})
        if not result.ok:
            raise SandboxError(f"could not write {path!r}: {result.stderr.strip()}")

    async def read_file(self, path: str) -> bytes:
        """The bytes of the regular file ``path`` (relative to the work dir, or under /work)."""
        relative = _relative(path)
        await self.start()
        return await _offload(self._read, path, f"{WORKDIR}/{relative}")

    def _read(self, path: str, absolute: str) -> bytes:
        import docker

        if self.container_id is None:
            raise SandboxError(f"sandbox {self.id} is closed; create a new one")
        where = f"{path!r} in sandbox {self.id}"
        try:
            stream, _ = api().get_archive(self.container_id, absolute)
            data = b"".join(stream)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"no file {where}") from None
        except docker.errors.APIError as exc:
            # The engine's text names host paths (/var/lib/docker/...): only its gist is kept.
            gist = "a parent of it is not a directory" if "not a directory" in str(exc) else ""
            raise SandboxError(
                f"could not read {where}: {gist or f'the engine answered {exc.status_code}'}"
            ) from None
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                member = archive.next()
                if member is None or not member.isfile():
                    raise SandboxError(f"{where} is not a regular file")
                extracted = archive.extractfile(member)
                assert extracted is not None
                return extracted.read()
        except tarfile.TarError as exc:
            raise SandboxError(f"could not read {where}: a bad archive ({exc})") from None


def _read_ahead(sock: Any, raw: Any) -> bytes:
    """The output the HTTP client already read past the exec's upgrade response.

    docker-py parses that response's headers through a buffered reader over the socket; when
    the command's first output arrived with them (a fast command on a busy machine), it waits
    in that reader's buffer, and the bare socket, which is what is read from then on, no
    longer has it.
    """
    response = getattr(sock, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if not hasattr(reader, "peek"):
        return b""
    timeout = raw.gettimeout()
    raw.settimeout(0)  # peek reads the socket only when its buffer is empty: never wait there
    try:
        ahead = reader.peek(1)
        return reader.read(len(ahead)) if ahead else b""
    except OSError:
        return b""
    finally:
        raw.settimeout(timeout)


def _send_then_close(raw: Any, payload: bytes, deadline: float) -> None:
    """Send the call's stdin, then half-close so the command sees end of input.

    A thread sends it when it is large, so that a command that writes before it reads
    cannot deadlock against us. The socket's timeout is the reader's (a short poll), so a
    send that times out is tried again until ``deadline``, never taken for an error.
    """

    def send() -> None:
        view = memoryview(payload)
        try:
            while view:
                try:
                    view = view[raw.send(view) :]
                except (TimeoutError, BlockingIOError):
                    if time.monotonic() >= deadline:
                        return
            raw.shutdown(socket.SHUT_WR)
        except OSError:  # the command exited without reading everything, or the call ended
            pass

    if len(payload) <= 64 << 10:
        send()
    else:
        threading.Thread(target=send, name="vime-docker-stdin", daemon=True).start()


def _finished(exec_id: str) -> bool:
    """Whether the exec's command has exited, as far as the engine can tell.

    An exec the engine has not started yet also reads as not running; only an exit code
    tells that it ran and ended.
    """
    import docker

    try:
        state = api().exec_inspect(exec_id)
    except docker.errors.NotFound:  # the container went away
        return True
    except docker.errors.APIError:  # a hiccup of the engine: keep waiting for the output
        return False
    return not state["Running"] and state["ExitCode"] is not None


def _pump(
    raw: Any,
    frames: _Frames,
    deadline: float,
    cancelled: threading.Event,
    exec_id: str | None,
) -> str:
    """Read one exec's output into ``frames`` until it ends.

    Returns "eof"; "exited" when the command exited but something it left in the background
    still holds its output open (checked while the stream is idle, unless ``exec_id`` is
    None: then only the end of the output or the deadline stops it); "deadline"; or
    "cancelled".
    """
    raw.settimeout(_POLL)
    exited = 0.0
    check_at, wait = time.monotonic() + _FIRST_CHECK, _FIRST_CHECK
    while True:
        now = time.monotonic()
        if cancelled.is_set():
            return "cancelled"
        if now >= deadline:
            return "deadline"
        if exited and now - exited >= _PIPE_GRACE:
            return "exited"
        try:
            chunk = raw.recv(1 << 16)
        except TimeoutError:
            if exec_id is not None and not exited and now >= check_at:
                if _finished(exec_id):
                    exited = now
                wait = min(wait * 2, _MAX_CHECK)
                check_at = now + wait
            continue
        except OSError:
            return "eof"  # the connection was torn down: the container is gone
        if not chunk:
            return "eof"
        frames.feed(chunk)
