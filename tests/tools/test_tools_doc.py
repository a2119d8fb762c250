"""docs/tools.md stays true: every Python block runs, and prints exactly the text block after it."""

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def blocks() -> list[tuple[str, str | None]]:
    found = re.findall(r"```(python|text)\n(.*?)```", DOC.read_text(), re.DOTALL)
    pairs = []
    for i, (kind, body) in enumerate(found):
        if kind == "python":
            following = found[i + 1] if i + 1 < len(found) else None
            pairs.append((body, following[1] if following and following[0] == "text" else None))
    return pairs


def test_every_example_prints_what_the_doc_shows():
    namespace: dict = {"__name__": "docs_tools"}
    pairs = blocks()
    assert len(pairs) == 3
    for code, shown in pairs:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(DOC), "exec"), namespace)
        if shown is not None:
            assert out.getvalue() == shown
