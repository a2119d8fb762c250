"""The sandbox interface every backend implements, its result type and its limits."""

from __future__ import annotations

import abc
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from vime.errors import VimeError


class SandboxError(VimeError):
    """A sandbox could not be created or used (missing tool, closed sandbox, bad path)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command or snippet did inside a sandbox.

    ``timed_out`` is True when the wall-clock limit killed it (``exit_code`` is then -9 or
    the signal's negative number); ``truncated`` is True when stdout or stderr went over the
    output cap and was cut.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its limits."""
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecResult:
        """The inverse of :meth:`to_dict`; unknown keys are ignored."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox. The defaults are safe for model-written code."""

    timeout: float = 30.0  # wall-clock seconds per call; the whole process tree is killed
    cpu_seconds: int = 60  # CPU time per call (RLIMIT_CPU)
    memory_bytes: int = 1 << 30  # address space / container memory: 1 GiB
    max_processes: int = 256  # processes and threads (pids)
    max_file_bytes: int = 64 << 20  # largest file a call may write: 64 MiB
    max_open_files: int = 256
    max_output_bytes: int = 1 << 20  # per stream; the rest is dropped and flagged
    network: bool = False  # no network unless asked for

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"sandbox limit {f.name} must be a bool, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"sandbox limit {f.name} must be a positive finite number, got {value!r}"
                )

    @classmethod
    def resolve(cls, limits: SandboxLimits | None = None, **overrides: Any) -> SandboxLimits:
        """``limits`` (or the defaults) with keyword overrides applied, e.g. ``timeout=5``."""
        return (limits or cls()).with_overrides(**overrides)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every limit."""
        return asdict(self)

    def with_overrides(self, **options: Any) -> SandboxLimits:
        """A copy with some limits changed; unknown names are an error."""
        unknown = set(options) - set(self.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown sandbox limit(s) {sorted(unknown)}; "
                f"known: {sorted(self.__dataclass_fields__)}"
            )
        return replace(self, **options)


@dataclass
class FileSpec:
    """A file to place in the work dir before a call (path relative to the work dir)."""

    path: str
    content: bytes | str
    mode: int = 0o644


LANGUAGES: dict[str, tuple[str, list[str]]] = {
    # language -> (file name, argv)
    "python": ("main.py", ["python3", "main.py"]),
    "bash": ("main.sh", ["bash", "main.sh"]),
    "sh": ("main.sh", ["sh", "main.sh"]),
}


class Sandbox(abc.ABC):
    """An isolated place to run model-written code, for the lifetime of one episode.

    Use it as an async context manager so it is always closed::

        async with vime.sandboxes.create("local") as box:
            result = await box.run_code("print(1)")
    """

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.closed = False

    async def start(self) -> None:
        """Prepare the sandbox before its first call (a container, a work dir); idempotent.

        ``async with`` and :class:`~vime.sandboxes.pool.SandboxPool` call it, so warm pools
        pay the setup cost ahead of time. Backends with nothing to prepare keep this no-op.
        """
        return None

    @abc.abstractmethod
    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a shell command line (str) or an argv list in the work dir."""

    @abc.abstractmethod
    async def write_file(self, path: str, content: str | bytes) -> None:
        """Write a file in the sandbox's work dir (``path`` is relative to it)."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file from the sandbox's work dir."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill everything the sandbox started and free its resources. Idempotent."""

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> ExecResult:
        """Run a code snippet in ``language`` (python, bash, sh)."""
        if language not in LANGUAGES:
            raise ValueError(f"unsupported language {language!r}; supported: {sorted(LANGUAGES)}")
        filename, argv = LANGUAGES[language]
        all_files = {**(files or {}), filename: code}
        return await self.run(argv, timeout=timeout, stdin=stdin, files=all_files)

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def shell_argv(command: str | Sequence[str]) -> list[str]:
    """argv for a command: a string runs through ``sh -c``, a list runs as is."""
    if isinstance(command, str):
        return ["sh", "-c", command]
    argv = list(command)
    if not argv:
        raise ValueError("empty command")
    return argv


def describe(command: str | Sequence[str]) -> str:
    """A short printable form of a command, for errors and logs."""
    return command if isinstance(command, str) else shlex.join(command)


@dataclass
class BackendInfo:
    """A registered backend: the class and a one-line description."""

    cls: type[Sandbox]
    description: str
    options: dict[str, Any] = field(default_factory=dict)
