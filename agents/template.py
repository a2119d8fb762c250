"""Chat-template rendering for token-in/token-out episodes: the first prompt, and the ids of
new env/tool messages as the *delta* the template appends after a sampled assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vime.errors import VimeError
from vime.types import Message

# Stand-ins for the conversation before the new messages. The delta is independent of them as
# long as the template renders a conversation by appending one message after another.
_ANCHOR_USER = "VIME_ANCHOR_QUESTION"
_ANCHOR_REPLY = "VIME_ANCHOR_REPLY"


class TemplateError(VimeError):
    """The chat template cannot be rendered as a prefix-preserving delta."""


class ChatTemplateRenderer:
    """Turns chat messages into token ids with a Hugging Face tokenizer's chat template.

    ``delta_ids`` returns the ids that follow a sampled assistant completion when
    ``new_messages`` are appended: the template's end-of-turn tail the model did not sample
    (e.g. ``<|im_end|>\\n`` after a stop string, or only ``\\n`` after a sampled
    ``<|im_end|>``), the new messages, and the generation prompt.
    """

    def __init__(self, tokenizer: Any, **template_kwargs: Any) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict] | None = None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for ``messages``."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Ids of rendered template text (special tokens come from the text itself)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[dict] | None = None
    ) -> list[int]:
        """Ids of the whole conversation plus the generation prompt (what vLLM would render)."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def delta_ids(
        self,
        new_messages: Sequence[Message],
        completion_ids: Sequence[int],
        tools: Sequence[dict] | None = None,
    ) -> list[int]:
        """Ids to append after ``completion_ids`` (the last sampled turn) for ``new_messages``.

        Raises :class:`TemplateError` when the template does not render the longer
        conversation as an extension of the shorter one (for example, it rewrites earlier
        turns); such templates cannot be used token-in/token-out.
        """
        base: list[Message] = [
            {"role": "user", "content": _ANCHOR_USER},
            {"role": "assistant", "content": _ANCHOR_REPLY},
        ]
        before = self.render(base, tools, add_generation_prompt=False)
        after = self.render([*base, *new_messages], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError(
                "the chat template does not render appended messages as an extension of the "
                f"earlier conversation (rendered {before[-80:]!r}, then {after[-160:]!r}); use "
                "an append-only template or the 'chat' agent mode with drift handling"
            )
        reply_end = before.rindex(_ANCHOR_REPLY) + len(_ANCHOR_REPLY)
        tail_ids = self.encode(before[reply_end:])
        # The model may already have sampled the start of the tail (its end-of-turn token).
        overlap = _longest_overlap(completion_ids, tail_ids)
        return tail_ids[overlap:] + self.encode(after[len(before) :])


def _longest_overlap(left: Sequence[int], right: Sequence[int]) -> int:
    """Largest k such that the last k items of ``left`` equal the first k of ``right``."""
    for k in range(min(len(left), len(right)), 0, -1):
        if list(left[-k:]) == list(right[:k]):
            return k
    return 0
