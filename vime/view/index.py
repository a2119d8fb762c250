"""The compact form of a run's episodes for the viewer: a column-wise index of every episode
(what filters need) and the episode bodies packed in gzip chunks that the page decodes only
when an episode is opened.

A chunk holds ``CHUNK`` consecutive episodes: ``uint32 L | L bytes of JSON | pad to 4 |
int32 ids[N] | float32 logprobs[M] | float32 trainer_logprobs[M] (when any is recorded) |
int32 versions[M] | uint8 mask[N]``, where N counts every token of the chunk and M only the
sampled ones (loss mask 1; elsewhere logprobs are 0 and versions -1 by the Trajectory
contract, so they are not stored). Each JSON body's ``tok`` is ``[token offset, N_i, sampled
offset, M_i]`` into those arrays.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

CHUNK = 32
PREVIEW_CHARS = 160
TOKEN_KEYS = ("token_ids", "loss_mask", "logprobs", "token_versions")
TRAINER_LOGPROBS = "trainer_logprobs"  # metadata key of the trainer's per-token logprobs


@dataclass
class PackedRun:
    """The index columns, the gzip chunks and the set of token ids that occur."""

    index: dict[str, list[Any]] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    token_ids: set[int] = field(default_factory=set)

    @property
    def count(self) -> int:
        """Number of episodes."""
        return len(self.index.get("task", []))


class _Codes:
    """Small integer codes for repeated strings (env ids, statuses)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._codes: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        if name not in self._codes:
            self._codes[name] = len(self.names)
            self.names.append(name)
        return self._codes[name]


def pack(records: Iterable[dict[str, Any]], *, default_env: str = "") -> PackedRun:
    """Index and chunk ``records`` (trajectory dump lines or eval result rows)."""
    run = PackedRun()
    columns = [
        *("step", "task", "sample", "env", "status", "reward", "correct", "ntok", "nresp"),
        *("turns", "drift", "vmin", "vmax", "error", "preview", "mismatch"),
    ]
    idx: dict[str, list[Any]] = {c: [] for c in columns}
    envs, statuses = _Codes(), _Codes()
    pending: list[dict[str, Any]] = []
    for record in records:
        row = _index_row(record, default_env)
        row["env"] = envs(row["env"])
        row["status"] = statuses(row["status"])
        for c in columns:
            idx[c].append(row[c])
        pending.append(record)
        if len(pending) == CHUNK:
            run.chunks.append(_chunk(pending, run.token_ids))
            pending = []
    if pending:
        run.chunks.append(_chunk(pending, run.token_ids))
    idx["envs"] = envs.names
    idx["statuses"] = statuses.names
    run.index = idx
    return run


def _index_row(r: dict[str, Any], default_env: str) -> dict[str, Any]:
    meta = r.get("metadata") or {}
    metrics = r.get("metrics") or {}
    mask = r.get("loss_mask") or []
    error = r.get("error")
    # An eval result row has no status: its error says whether it failed.
    status = str(r["status"]) if "status" in r else "failed" if error else "completed"
    correct = metrics.get("correct", r.get("correct"))
    versions = [v for v in r.get("weight_versions") or [] if v is not None and v >= 0]
    return {
        "step": int(r.get("step", meta.get("step", 0)) or 0),
        "task": str(r.get("task_id", "")),
        "sample": int(r.get("sample_index", 0) or 0),
        "env": str(meta.get("env_id") or r.get("env") or default_env),
        "status": status,
        "reward": _finite(r.get("reward")),
        "correct": -1 if correct is None else int(bool(correct)),
        "ntok": len(r.get("token_ids") or []),
        "nresp": sum(mask),
        "turns": int(metrics.get("num_turns", r.get("turns", 0)) or 0),
        "drift": int(metrics.get("drift_count", 0) or 0),
        "vmin": min(versions) if versions else -1,
        "vmax": max(versions) if versions else -1,
        "error": str(error)[:200] if error else "",
        "preview": _preview(r),
        "mismatch": _max_mismatch(r),
    }


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _preview(r: dict[str, Any]) -> str:
    """The last assistant text (or an eval row's response), squeezed to one short line."""
    text = r.get("response") or ""
    for message in reversed(r.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            text = _content_text(message.get("content"))
            break
    text = " ".join(str(text).split())
    return text[:PREVIEW_CHARS]


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _max_mismatch(r: dict[str, Any]) -> float | None:
    """max |trainer - rollout| logprob over the sampled tokens, when the trainer's are recorded."""
    trainer = (r.get("metadata") or {}).get(TRAINER_LOGPROBS)
    if not trainer:
        return None
    pairs = zip(trainer, r.get("logprobs") or [], r.get("loss_mask") or [], strict=False)
    diffs = [abs(a - b) for a, b, m in pairs if m]
    return round(max(diffs), 6) if diffs else None


def _chunk(records: list[dict[str, Any]], seen: set[int]) -> bytes:
    ids, mask = array("i"), array("B")
    logprobs, trainer, versions = array("f"), array("f"), array("i")
    any_trainer = False
    bodies = []
    for r in records:
        token_ids = list(r.get("token_ids") or [])
        loss_mask = list(r.get("loss_mask") or [0] * len(token_ids))
        lps = list(r.get("logprobs") or [0.0] * len(token_ids))
        vers = list(r.get("token_versions") or [-1] * len(token_ids))
        meta = dict(r.get("metadata") or {})
        tlp = meta.pop(TRAINER_LOGPROBS, None)
        sampled = [i for i, m in enumerate(loss_mask) if m]
        tok = [len(ids), len(token_ids), len(logprobs), len(sampled)]
        ids.extend(token_ids)
        seen.update(token_ids)
        mask.extend(1 if m else 0 for m in loss_mask)
        logprobs.extend(lps[i] for i in sampled)
        versions.extend(vers[i] if i < len(vers) else -1 for i in sampled)
        if tlp and len(tlp) == len(token_ids):
            any_trainer = True
            trainer.extend(tlp[i] for i in sampled)
        else:
            trainer.extend(math.nan for _ in sampled)
        if "segments" in meta:  # earlier pieces of a split episode: count them, not repeat them
            meta["segments"] = len(meta["segments"])
        body = {k: v for k, v in r.items() if k not in TOKEN_KEYS and k != "metadata"}
        body["metadata"] = meta
        body["tok"] = tok
        body["has_trainer"] = bool(tlp)
        bodies.append(body)
    header = json.dumps(
        {"n": len(ids), "m": len(logprobs), "trainer": any_trainer, "items": bodies},
        ensure_ascii=False,
        default=str,
    ).encode("utf-8")
    header += b" " * (-(4 + len(header)) % 4)
    arrays = [ids, logprobs, *([trainer] if any_trainer else []), versions, mask]
    if sys.byteorder == "big":  # the page reads little-endian
        for a in arrays:
            a.byteswap()
    parts = [len(header).to_bytes(4, "little"), header, *(a.tobytes() for a in arrays)]
    return gzip.compress(b"".join(parts), compresslevel=6, mtime=0)


def token_pieces(tokenizer: str | None, ids: set[int]) -> dict[int, str]:
    """The text of each id in ``ids`` from ``tokenizer`` (a model folder or a tokenizer.json);
    empty when there is none, and the page then shows ids."""
    from pathlib import Path

    if not tokenizer or not ids:
        return {}
    path = Path(tokenizer)
    path = path / "tokenizer.json" if path.is_dir() else path
    if not path.is_file():
        return {}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    ordered = sorted(i for i in ids if 0 <= i < tok.get_vocab_size(with_added_tokens=True))
    texts = tok.decode_batch([[i] for i in ordered], skip_special_tokens=False)
    return dict(zip(ordered, texts, strict=True))
