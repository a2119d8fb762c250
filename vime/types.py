"""Shared data types: chat messages, parsed tool calls and token-level trajectories.

This module sits at the bottom of the dependency graph: it imports nothing from Vime.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Message = dict[str, Any]
"""An OpenAI chat message: ``{"role": ..., "content": ..., ["tool_calls" | "tool_call_id" | "name"]}``."""


@dataclass(frozen=True)
class ToolCall:
    """One tool call found in a model's output.

    ``status`` is ``"ok"`` when ``name`` and ``arguments`` were parsed, ``"malformed"`` when the
    text looked like a call but could not be parsed (``error`` says why). ``raw`` is the exact
    text span the call came from, so nothing the model wrote is ever lost.
    """

    name: str
    arguments: dict[str, Any]
    id: str = ""
    status: Literal["ok", "malformed"] = "ok"
    raw: str = ""
    error: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The call in OpenAI ``tool_calls`` format (arguments as a JSON string)."""
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }

    @classmethod
    def from_openai(cls, d: Any) -> ToolCall:
        """Read one entry of an OpenAI ``tool_calls`` list (a dict or an SDK object).

        Never raises for model faults: arguments that are not a JSON object, or a missing name,
        give ``status="malformed"`` with ``error`` saying why and ``raw`` holding the arguments
        text. An empty arguments string counts as ``{}``. An entry marked ``"status":
        "malformed"`` (as Vime's tool-call parsers write them) stays malformed with its
        ``"error"``.
        """
        import json

        if hasattr(d, "model_dump"):
            d = d.model_dump()
        if not isinstance(d, dict):
            return cls(
                "",
                {},
                status="malformed",
                raw=repr(d),
                error=f"a tool call must be an object, got {d!r:.80}",
            )
        call_id = str(d.get("id") or "")
        fn = d.get("function")
        if not isinstance(fn, dict):
            return cls(
                "",
                {},
                call_id,
                "malformed",
                json.dumps(d, default=repr),
                f"tool call has no 'function' object: {d!r:.80}",
            )
        name, args = fn.get("name"), fn.get("arguments")
        raw = args if isinstance(args, str) else json.dumps(args, default=repr)
        if d.get("status") == "malformed":  # written by vime.tool_parsers.to_assistant_message
            return cls(
                str(name or ""),
                {},
                call_id,
                "malformed",
                raw,
                str(d.get("error") or "malformed call"),
            )
        if not isinstance(name, str) or not name:
            return cls(
                "",
                {},
                call_id,
                "malformed",
                raw,
                f"tool call has no function name (got {name!r:.40})",
            )
        if args is None or (isinstance(args, str) and not args.strip()):
            return cls(name, {}, call_id, raw=raw)
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError) as e:  # bad syntax, or nesting too deep
                return cls(
                    name,
                    {},
                    call_id,
                    "malformed",
                    raw,
                    f"arguments are not valid JSON ({e}): {args!r:.80}",
                )
        if not isinstance(args, dict):
            kind = type(args).__name__
            return cls(
                name,
                {},
                call_id,
                "malformed",
                raw,
                f"arguments must be a JSON object, got a {kind}: {raw!r:.80}",
            )
        return cls(name, args, call_id, raw=raw)


class Status(enum.StrEnum):
    """How an episode ended."""

    COMPLETED = "completed"  # the env terminated it
    TRUNCATED = "truncated"  # a limit (turns, context, time) cut it
    ABORTED = "aborted"  # Vime stopped it on purpose (abort, weight update, shutdown)
    FAILED = "failed"  # an error in the env, a tool, a sandbox or an engine


@dataclass
class Trajectory:
    """One episode as token ids, ready for training.

    ``token_ids``, ``loss_mask`` and ``logprobs`` have the same length and cover the whole
    sequence, prompt included: ``loss_mask`` is 1 exactly on ids the model sampled, and
    ``logprobs`` holds the engine's logprob for those ids and 0.0 elsewhere.
    ``token_versions`` gives, per token, the weight version that produced it (-1 where the
    mask is 0), so partial rollouts that straddle a weight update stay honest.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    turn_rewards: list[float] = field(default_factory=list)
    status: Status = Status.COMPLETED
    weight_versions: list[int] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    task_id: str = ""
    sample_index: int = 0
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"token_ids, loss_mask and logprobs must have the same length, got "
                f"{n}, {len(self.loss_mask)} and {len(self.logprobs)}"
            )
        if not 0 <= self.prompt_length <= n:
            raise ValueError(f"prompt_length {self.prompt_length} is outside [0, {n}]")
        self.status = Status(self.status)

    @property
    def num_response_tokens(self) -> int:
        """Number of ids the model sampled (loss_mask == 1)."""
        return sum(self.loss_mask)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the JSONL dump format)."""
        d = asdict(self)
        d["status"] = str(self.status)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`; unknown keys are kept in ``metadata``."""
        known = {f for f in cls.__dataclass_fields__}
        extra = {k: v for k, v in d.items() if k not in known}
        kwargs = {k: v for k, v in d.items() if k in known}
        if extra:
            kwargs.setdefault("metadata", {}).update(extra)
        return cls(**kwargs)
