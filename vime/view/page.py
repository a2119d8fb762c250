"""The viewer page: overview, filters and the trajectory browser in one HTML file.

The page is self-contained: the index, the token texts, the script and the style are inline,
and so are the episode bodies (base64 gzip chunks in inert ``<script type=
"application/octet-stream">`` blocks after the script), unless ``chunk_url`` is given, in which
case the page fetches chunks from the server that served it (``vime view --serve``). A
Content-Security-Policy lets only the page's own script run (by its hash): text from a model or
an env can never execute, even if it reached the DOM as markup.
"""

from __future__ import annotations

import base64
import hashlib
import json
from html import escape
from importlib import resources
from pathlib import Path
from typing import IO, Any

from vime.view.index import CHUNK, PackedRun
from vime.view.overview import eval_overview, train_overview
from vime.view.source import RunSource


def _asset(name: str) -> str:
    return resources.files("vime.view").joinpath(name).read_text(encoding="utf-8")


def _data_block(element_id: str, value: Any) -> str:
    # '<' escaped inside JSON strings, so no '</script>' or '<!--' can end the block early.
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def write_page(
    out: IO[str],
    source: RunSource,
    packed: PackedRun,
    pieces: dict[int, str],
    *,
    chunk_url: str | None = None,
) -> None:
    """Write the page for ``source`` to ``out``."""
    script = _asset("viewer.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    policy = (
        f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
        "img-src data:; connect-src 'self'"
    )
    overview = (
        eval_overview(source.eval_summary)
        if source.kind == "eval"
        else train_overview(source.history)
    )
    meta = {"index": packed.index, "chunk_size": CHUNK, "chunk_url": chunk_url}
    sorts = [
        ("", "file order"),
        ("-reward", "reward, high first"),
        ("+reward", "reward, low first"),
        ("-nresp", "longest response"),
        ("-mismatch", "largest trainer − rollout gap"),
        ("+step", "step"),
    ]
    options = "".join(f'<option value="{v}">{escape(label)}</option>' for v, label in sorts)
    title = escape(source.title)
    out.write(
        f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<link rel="icon" href="data:,">
<title>{title}</title><style>{_asset("viewer.css")}</style></head><body>
<header><h1>vime view: {title}</h1><p>{escape(str(source.path))} &middot; {packed.count} episodes</p></header>
<section id="overview"><h2>overview</h2>{overview}</section>
<section id="browser"><h2>trajectories</h2>
<div id="filters">
<label>step <input id="f-step-min" type="number" placeholder="min"> &ndash;
<input id="f-step-max" type="number" placeholder="max"></label>
<label>env <select id="f-env"><option value="">any</option></select></label>
<label>task <input id="f-task" type="search" placeholder="task id"></label>
<label>reward <input id="f-reward-min" type="number" step="any" placeholder="min"> &ndash;
<input id="f-reward-max" type="number" step="any" placeholder="max"></label>
<label>status <select id="f-status"><option value="">any</option></select></label>
<label>text <input id="f-text" type="search" placeholder="answer, error, task"></label>
<label title="also search every message and tool call (reads every episode once)">
<input id="f-deep" type="checkbox"> in whole episodes</label><span id="deep-status"></span>
<label>sort <select id="f-sort">{options}</select></label>
<span id="count"></span></div>
<div id="panes"><div id="list"><div id="list-inner"></div></div>
<div id="detail"><p class="note">Pick a trajectory on the left.</p></div></div>
</section>
{_data_block("vime-meta", meta)}
{_data_block("vime-pieces", {str(k): v for k, v in pieces.items()})}
<script>{script}</script>
"""
    )
    if chunk_url is None:
        for n, chunk in enumerate(packed.chunks):
            out.write(f'<script type="application/octet-stream" id="c{n}">')
            out.write(base64.b64encode(chunk).decode("ascii"))
            out.write("</script>\n")
    out.write("</body></html>\n")


def write_file(
    path: str | Path, source: RunSource, packed: PackedRun, pieces: dict[int, str]
) -> Path:
    """Write the self-contained page to ``path`` (atomically) and return it."""
    import os

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        write_page(f, source, packed, pieces)
    os.replace(tmp, path)
    return path
