"""One-bug mutants of Python source by AST: each mutation is a minimal text edit of whole
lines inside a function body, so the diff reads like a real slip, not a rewrite."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = (
    "operator_swap",
    "comparison_swap",
    "off_by_one",
    "wrong_constant",
    "dropped_branch",
    "swapped_arguments",
    "wrong_return",
)

_BINOPS = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "//"),
    ast.FloorDiv: ("//", "*"),
    ast.Div: ("/", "*"),
    ast.Mod: ("%", "//"),
    ast.BitAnd: ("&", "|"),
    ast.BitOr: ("|", "&"),
    ast.LShift: ("<<", ">>"),
    ast.RShift: (">>", "<<"),
}
_COMPARES = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
}
_BOOLOPS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
# operator tokens in the text between two operands (comments removed first)
_TOKEN = re.compile(
    r"(?:<<|>>|//|\*\*|[-+*/%&|^@])=|\bnot\s+in\b|\bis\s+not\b|\bin\b|\bis\b|\band\b|\bor\b|<<|>>|//|<=|>=|==|!=|\*\*|[-+*/%&|<>^@]"
)


@dataclass(frozen=True)
class Mutation:
    """One bug: lines ``start``..``end`` (1-based, inclusive) of ``path`` read ``old`` in the
    original and ``new`` in the mutant."""

    kind: str
    path: str
    function: str
    start: int
    end: int
    old: str
    new: str


class _Source:
    def __init__(self, text: str):
        self.lines = text.splitlines(keepends=True)
        starts = [0]
        for line in self.lines:
            starts.append(starts[-1] + len(line))
        self.starts = starts
        self.text = text

    def offset(self, line: int, col: int) -> int:
        # ast columns are UTF-8 byte offsets
        return self.starts[line - 1] + len(self.lines[line - 1].encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )


def _no_comments(text: str) -> str:
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), text)


class _Finder:
    """Yields ``(kind, [(start, end, replacement)])`` text edits for one function."""

    def __init__(self, source: _Source):
        self.src = source

    def _operator(self, left: ast.AST, right: ast.AST, symbol: str, new: str):
        gap_start, gap_end = self.src.span(left)[1], self.src.span(right)[0]
        gap = _no_comments(self.src.text[gap_start:gap_end])
        match = _TOKEN.search(gap)
        if match is None or re.sub(r"\s+", " ", match.group()) != symbol:
            return None
        return [(gap_start + match.start(), gap_start + match.end(), new)]

    def edits(self, fn: ast.AST) -> Iterator[tuple[str, list[tuple[int, int, str]]]]:
        docstring = ast.get_docstring(fn, clean=False) is not None  # type: ignore[arg-type]
        body = fn.body[1:] if docstring else fn.body  # type: ignore[attr-defined]
        yield from self._statement_edits(fn)  # type: ignore[arg-type]
        for statement in body:
            for node in ast.walk(statement):
                yield from self._node_edits(node)

    def _statement_edits(self, top: ast.stmt) -> Iterator[tuple[str, list[tuple[int, int, str]]]]:
        for node in ast.walk(top):
            for block in ("body", "orelse", "finalbody"):
                statements = getattr(node, block, None)
                if not isinstance(statements, list):
                    continue
                for statement in statements:
                    if not (isinstance(statement, ast.If) and not statement.orelse):
                        continue
                    start = self.src.starts[statement.lineno - 1]
                    end = self.src.starts[statement.end_lineno]  # type: ignore[index]
                    line = self.src.lines[statement.lineno - 1]
                    indent = line[: len(line) - len(line.lstrip())]
                    alone = len(statements) == 1
                    yield "dropped_branch", [(start, end, f"{indent}pass\n" if alone else "")]

    def _node_edits(self, node: ast.AST) -> Iterator[tuple[str, list[tuple[int, int, str]]]]:
        if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BINOPS:
            symbol, new = _BINOPS[type(node.op)]
            if isinstance(node, ast.AugAssign):
                edit = self._operator(node.target, node.value, symbol + "=", new + "=")
            else:
                edit = self._operator(node.left, node.right, symbol, new)
            if edit:
                yield "operator_swap", edit
        elif isinstance(node, ast.BoolOp):
            symbol, new = _BOOLOPS[type(node.op)]
            edit = self._operator(node.values[0], node.values[1], symbol, new)
            if edit:
                yield "operator_swap", edit
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                symbol, new = _COMPARES[type(op)]
                edit = self._operator(left, right, symbol, new)
                if edit:
                    yield "comparison_swap", edit
                left = right
        elif isinstance(node, ast.Constant) and hasattr(node, "end_col_offset"):
            yield from self._constant_edits(node)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            a, b = node.args[0], node.args[1]
            if not any(isinstance(x, ast.Starred) for x in (a, b)):
                (a0, a1), (b0, b1) = self.src.span(a), self.src.span(b)
                ta, tb = self.src.text[a0:a1], self.src.text[b0:b1]
                if ta != tb and "\n" not in ta + tb:
                    yield "swapped_arguments", [(b0, b1, ta), (a0, a1, tb)]
        elif isinstance(node, ast.Return) and node.value is not None:
            returns_none = isinstance(node.value, ast.Constant) and node.value.value is None
            if not returns_none:
                start, end = self.src.span(node.value)
                yield "wrong_return", [(start, end, "None")]

    def _constant_edits(
        self, node: ast.Constant
    ) -> Iterator[tuple[str, list[tuple[int, int, str]]]]:
        start, end = self.src.span(node)
        written = self.src.text[start:end]
        value = node.value
        if isinstance(value, bool):
            yield "wrong_constant", [(start, end, str(not value))]
        elif isinstance(value, int) and written.isdigit():
            yield "off_by_one", [(start, end, str(value + 1))]
            if value > 0:
                yield "off_by_one", [(start, end, str(value - 1))]


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def mutations(path: str, text: str) -> list[Mutation]:
    """Every single-edit mutant of the functions in ``text`` that still compiles and differs
    from the original, in source order."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    src = _Source(text)
    found: list[Mutation] = []
    seen: set[tuple[int, int, str]] = set()
    # a nested function's code is reached from each enclosing function too: `seen` drops repeats
    for fn in _functions(tree):
        for kind, edits in _Finder(src).edits(fn):
            first = min(e[0] for e in edits)
            last = max(e[1] for e in edits)
            start_line = text.count("\n", 0, first) + 1
            end_line = text.count("\n", 0, max(last - 1, first)) + 1
            mutated = _apply(text, edits)
            if mutated == text:
                continue
            old = "".join(src.lines[start_line - 1 : end_line])
            delta = len(mutated) - len(text)
            new = mutated[src.starts[start_line - 1] : src.starts[end_line] + delta]
            key = (start_line, end_line, new)
            if key in seen:
                continue
            try:
                compile(mutated, path, "exec")
            except SyntaxError:
                continue
            seen.add(key)
            found.append(Mutation(kind, path, fn.name, start_line, end_line, old, new))
    return found


def unique_edit(text: str, start: int, old: str, new: str) -> tuple[str, str]:
    """``(old, new)`` widened by whole lines of context until ``old`` occurs once in
    ``text``, where ``old`` is the text of ``text``'s lines from ``start`` (1-based; it may be
    empty, for an insertion before that line), for a str_replace-style edit."""
    lines = text.splitlines(keepends=True)
    before, after = start - 1, start - 1 + old.count("\n")
    while text.count(old) != 1:
        if before == 0 and after >= len(lines):
            raise ValueError(f"no unique context around line {start}")
        if before > 0:
            before -= 1
            old, new = lines[before] + old, lines[before] + new
        if text.count(old) != 1 and after < len(lines):
            old, new = old + lines[after], new + lines[after]
            after += 1
    return old, new
