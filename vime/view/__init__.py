"""``vime view``: a self-contained HTML page (or a local server) to browse a train run, an eval
or a rollout file: per-step curves, filters over every episode, messages and tokens."""

from __future__ import annotations

from pathlib import Path

from vime.view.index import PackedRun, pack, token_pieces
from vime.view.source import RunSource, open_run

__all__ = ["PackedRun", "RunSource", "build", "default_output", "open_run", "write_view"]


def build(
    path: str | Path, *, tokenizer: str | None = None
) -> tuple[RunSource, PackedRun, dict[int, str]]:
    """Read the run at ``path`` and pack it for the page: source, index and chunks, token texts."""
    source = open_run(path, tokenizer=tokenizer)
    packed = pack(source.records(), default_env=source.default_env)
    return source, packed, token_pieces(source.tokenizer, packed.token_ids)


def default_output(path: str | Path) -> Path:
    """Where the page goes by default: ``view.html`` inside a run dir, ``X.html`` beside a
    file ``X.jsonl``."""
    path = Path(path)
    return path.with_suffix(".html") if path.is_file() else path / "view.html"


def write_view(
    path: str | Path, out: str | Path | None = None, *, tokenizer: str | None = None
) -> Path:
    """Write the viewer page of the run at ``path`` to ``out`` (default: :func:`default_output`)."""
    from vime.view.page import write_file

    source, packed, pieces = build(path, tokenizer=tokenizer)
    return write_file(out or default_output(path), source, packed, pieces)
