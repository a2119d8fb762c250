"""Options of the sandbox server (``vime sandbox serve``), one typed source for flags and API."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError
from vime.sandboxes.base import SandboxLimits

TOKEN_ENV = "VIME_SANDBOX_TOKEN"
URL_ENV = "VIME_SANDBOX_URL"


@dataclass
class ServerConfig:
    """Sandbox server: backend, access token, concurrency and time limits."""

    host: str = option("127.0.0.1", help="Address to listen on.")
    port: int = option(8790, help="Port to listen on; 0 picks a free one (printed at start).")
    backend: Literal["local", "docker"] = option("local", help="Backend of the sandboxes.")
    token_file: str | None = option(
        None, help=f"File holding the bearer token clients must send (else ${TOKEN_ENV})."
    )
    max_concurrency: int = option(32, help="Calls running at once; more wait in a queue.")
    max_sandboxes: int = option(256, help="Open sandboxes at once; more are refused (429).")
    call_timeout: float = option(
        300.0, help="Longest a call may run, and wait in the queue, in seconds."
    )
    idle_timeout: float = option(
        900.0, help="Close a sandbox no client used for this many seconds."
    )
    header_timeout: float = option(
        10.0, help="Close a new connection that has not sent a request head within this time."
    )
    keepalive_timeout: float = option(
        30.0, help="Close a connection idle for this long between two requests, in seconds."
    )
    read_timeout: float = option(
        60.0, help="Refuse (408) a request whose body has not arrived within this time."
    )
    max_connections: int = option(
        1024,
        help="Open connections at once (fewer if the open-file limit is lower); at the cap a "
        "new connection closes the longest idle one.",
    )
    limit: list[str] = option(
        [],
        help="Highest sandbox limit a client may ask for (and the default), as KEY=VALUE, "
        "e.g. --limit timeout=120 memory_bytes=2147483648. Keys: "
        + ", ".join(f.name for f in fields(SandboxLimits)),
        metavar="KEY=VALUE",
    )

    def __post_init__(self) -> None:
        positive = ("max_concurrency", "max_sandboxes", "call_timeout", "idle_timeout")
        positive += ("header_timeout", "keepalive_timeout", "read_timeout", "max_connections")
        for name in positive:
            if getattr(self, name) <= 0:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be positive, got {getattr(self, name)!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port}")
        self.limits()

    def limits(self) -> SandboxLimits:
        """The ceiling (and default) of the limits of the server's sandboxes."""
        types = {f.name: f.type for f in fields(SandboxLimits)}
        values: dict[str, object] = {}
        for item in self.limit:
            key, sep, raw = item.partition("=")
            if not sep or key not in types:
                raise ConfigError(
                    f"--limit {item!r}: expected KEY=VALUE with KEY one of {sorted(types)}"
                )
            try:
                if types[key] == "bool":
                    if raw.lower() not in {"true", "false", "1", "0"}:
                        raise ValueError(raw)
                    values[key] = raw.lower() in {"true", "1"}
                else:
                    values[key] = (float if types[key] == "float" else int)(raw)
            except ValueError:
                raise ConfigError(f"--limit {item!r}: {raw!r} is not a {types[key]}") from None
        if "timeout" not in values:  # the default call must fit under --call-timeout
            values["timeout"] = min(SandboxLimits.timeout, self.call_timeout)
        elif values["timeout"] > self.call_timeout:  # type: ignore[operator]
            raise ConfigError(
                f"--limit timeout={values['timeout']} is above --call-timeout "
                f"{self.call_timeout}: no call could use it; lower it or raise --call-timeout"
            )
        try:
            return SandboxLimits(**values)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--limit: {exc}") from None

    def token(self) -> str:
        """The bearer token: the first line of ``token_file``, else ``$VIME_SANDBOX_TOKEN``."""
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"--token-file {self.token_file!r}: {exc.strerror}") from None
            source = f"--token-file {self.token_file!r}"
        else:
            token = os.environ.get(TOKEN_ENV, "").strip()
            source = f"${TOKEN_ENV}"
        if len(token) < 16:
            raise ConfigError(
                f"the sandbox server needs a token of at least 16 characters ({source} gives "
                f"{len(token)}): set {TOKEN_ENV} or pass --token-file FILE, e.g. "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE"
            )
        return token
