"""The agent loop's options, as one typed config (flags are generated from it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError


@dataclass
class AgentConfig:
    """How an agent plays an episode and records its tokens."""

    mode: Literal["tokens", "chat"] = option(
        "tokens",
        help="tokens: render the chat template here and send token ids (exact, never "
        "re-tokenizes); chat: send messages and let the engine render them (drift is checked)",
        flag="--agent-mode",
    )
    max_turns: int = option(8, help="assistant turns before the episode is truncated")
    max_context_tokens: int | None = option(
        None, help="context window; a turn that would not fit ends the episode as truncated"
    )
    drift: Literal["mask", "split"] = option(
        "mask",
        help="when the engine's prompt does not extend the recorded ids: mask the sampled ids "
        "that can no longer be proven, or split the episode into separate training samples",
    )
    tool_parser: str | None = option(
        None,
        help="tool-call parser for the model's text (hermes, llama3, xml); default: the env's",
    )

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"--max-turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ConfigError(
                f"--max-context-tokens must be >= 2 (or unset), got {self.max_context_tokens}"
            )
