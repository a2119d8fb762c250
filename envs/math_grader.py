"""Grading one math reply against a gold answer (runs in a grading worker, see
:mod:`vime.envs.grading`): find the final answer, reject answers that are not values or that
hedge, then compare with math-verify. The rules are documented in docs/envs.md (Math-v0)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

# Without a \boxed answer math-verify reads the end of the reply: the answer is asked for last.
FALLBACK_CHARS = 4000
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_UNIT_WORD = re.compile(r"(?<![\\A-Za-z])([A-Za-z]{2,}\.?)\s*$")
# Two different numbers offered as the answer: "7 or 8", "7, 8", "7 8" (a final line that is a
# list); "8 + 6 = 14" is not a list. Thousands separators ("1,000") stay inside one number.
_NUM = r"(?<![\d.])-?\d+(?:\.\d+)?"
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_HEDGE = re.compile(
    rf"({_NUM})(?:\s*(?:,|;|\bor\b|\band\b|\\text\{{\s*or\s*\}})\s*|\s+)({_NUM})(?!\d)"
)
_OR_WORDS = re.compile(r"\\(?:lor|vee|pm|mp)(?![A-Za-z])|\bor\b")
_FRACTION = re.compile(r"\\frac\{(-?\d+)\}\{(\d+)\}")


@dataclass(frozen=True)
class MathGrade:
    """How a reply did: ``correct``; the ``extracted`` final answer (as written);
    ``answer_key``, the answer's equivalence class for majority votes (the gold's when
    correct; None when there is no valid answer); ``rejected``: why an answer found was not
    scored (``not_a_value``, ``several_answers``, ``restates_question``) or ""."""

    correct: bool
    extracted: str
    answer_key: str | None
    rejected: str = ""


def boxed_answers(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (or ``\\fbox``) in ``text``, in order, braces
    matched; an unclosed box runs to the end of the text."""
    found = []
    for match in _BOX.finditer(text):
        depth, start = 1, match.end()
        index = start
        while index < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            index += 1
        found.append(text[start : index - 1 if depth == 0 else index].strip())
    return found


def normalize_answer(answer: str) -> str:
    """A written answer made readable for math-verify: ``1.5e3`` becomes ``1500`` and a
    trailing unit word (``12 dollars``, ``5 cm``) is dropped."""
    answer = _E_NOTATION.sub(_expand_e_notation, answer.strip())
    while (unit := _UNIT_WORD.search(answer)) and re.search(r"\d\s*$", answer[: unit.start()]):
        answer = answer[: unit.start()].rstrip()
    return answer


def _expand_e_notation(match: re.Match[str]) -> str:
    mantissa, exponent = match.group(1), int(match.group(2))
    if abs(exponent) > 100:  # keep huge ones symbolic rather than writing 10^9 digits
        return f"{mantissa}\\times 10^{{{exponent}}}"
    try:
        return format(Decimal(f"{mantissa}e{exponent}").normalize(), "f")
    except InvalidOperation:
        return match.group(0)


def hedges(text: str) -> bool:
    """Whether ``text`` offers two different numbers as the answer ("7 or 8", "7, 8")."""
    return any(first != second for first, second in _HEDGE.findall(_THOUSANDS.sub("", text)))


def integer_fraction(answer: str) -> bool:
    """Whether ``answer`` holds an integer written as a fraction (``\\frac{28}{2}``):
    math-verify evaluates fractions, so their structure is gone after parsing."""
    return any(int(q) and int(p) % int(q) == 0 for p, q in _FRACTION.findall(answer))


def grade(
    response: str, gold: str, question: str | None = None, *, values_only: bool = True
) -> MathGrade:
    """Grade ``response`` against ``gold``.

    The final answer is the last ``\\boxed{}`` anywhere in the reply; without one,
    math-verify's extraction from the reply's last :data:`FALLBACK_CHARS` characters. It
    scores 0 when several boxes or the final line give different answers, when it restates an
    expression of ``question``, or (``values_only`` and a gold that is itself a value) when it
    is an expression that still needs evaluating (``6 + 8``, ``12 \\times 12``, ``2^{10}``).
    """
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # the "timeout disabled" notice
    gold_text = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    gold_parsed = parse(gold_text, parsing_timeout=None)
    boxes = [normalize_answer(b) for b in boxed_answers(response)]
    if boxes:
        predicted = parse(f"\\boxed{{{boxes[-1]}}}", parsing_timeout=None)
        hedged = bool(_OR_WORDS.search(boxes[-1])) or hedges(boxes[-1])
        hedged = hedged or _boxes_disagree(boxes, predicted)
    else:
        tail = response[-FALLBACK_CHARS:]
        predicted = parse(tail, parsing_timeout=None)
        last_line = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
        hedged = hedges(last_line)
    extracted = str(predicted[-1]) if predicted else ""
    if not gold_parsed or not predicted:
        return MathGrade(False, extracted, None)
    value = predicted[0]
    if not _several(gold_parsed[0]) and (hedged or _several(value)):
        return MathGrade(False, extracted, None, "several_answers")
    value_expected = values_only and not needs_evaluating(gold_parsed[0])
    if value_expected and (needs_evaluating(value) or integer_fraction(extracted)):
        return MathGrade(False, extracted, None, "not_a_value")
    if question is not None and restates_question(extracted, question, gold):
        return MathGrade(False, extracted, None, "restates_question")
    if verify(gold_parsed, predicted, timeout_seconds=None):
        return MathGrade(True, extracted, answer_key(gold_parsed[0], extracted))
    return MathGrade(False, extracted, answer_key(value, extracted))


def warm_up() -> None:
    """Grade a sample reply once, so the lazy imports of math-verify and sympy are paid at a
    grading worker's start, not by the first real answer."""
    grade("so the answer is \\boxed{\\frac{1}{2}}", "0.5", "What is 1/2?")


def _boxes_disagree(boxes: list[str], final: list[Any]) -> bool:
    from math_verify import parse, verify

    for box in boxes[:-1]:
        if box != boxes[-1] and not verify(final, parse(f"\\boxed{{{box}}}", parsing_timeout=None)):
            return True
    return False


def _several(value: Any) -> bool:
    """Whether a parsed answer holds several values (a set, tuple, interval or union)."""
    from sympy import FiniteSet, Interval, Tuple, Union

    if isinstance(value, FiniteSet):
        return len(value) > 1
    return isinstance(value, Interval | Tuple | Union)


def answer_key(value: Any, written: str) -> str:
    """The equivalence class of a parsed answer for majority votes: ``x = 1000`` and
    ``1,000`` give ``1000``, ``0.5`` gives ``1/2`` (``written`` when it cannot be printed)."""
    from sympy import Eq, Rational, Symbol

    if isinstance(value, Eq) and isinstance(value.lhs, Symbol):
        value = value.rhs
    try:
        if getattr(value, "is_Float", False):
            value = Rational(str(value))
        return str(value)
    except ValueError:  # an integer past Python's limit on decimal digits
        return written


def restates_question(extracted: str, question: str, gold: str) -> bool:
    """Whether ``extracted`` is an expression copied from ``question`` rather than a value.

    Plain numbers and the gold answer itself never count as restatements.
    """
    answer = "".join(extracted.split())
    if not answer or answer == "".join(gold.split()) or _NUMBER.fullmatch(answer):
        return False
    return answer in "".join(question.split())


# --- is the answer a value? ---------------------------------------------------------------------

_MAX_ROOT_BITS = 700  # radicands beyond this (about 200 digits) are left as closed forms


def _numeric(e: Any) -> bool:
    """Whether ``e`` is plain numbers joined by + * ^ or !: its value is a number one could
    compute, so writing it this way leaves the work undone."""
    from sympy import Add, Mul, Pow, binomial, factorial

    if e.is_Number:
        return True
    if isinstance(e, Add | Mul | factorial | binomial):
        return all(_numeric(a) for a in e.args)
    if isinstance(e, Pow):
        return (
            _numeric(e.base) and _numeric(e.exp) and not (e.exp.is_Number and not e.exp.is_Integer)
        )
    return False


def _written_value(e: Any) -> bool:
    """The numeric forms that count as values: a number, ``-x``, ``1/q``, a fraction
    ``p/q`` that is not an integer, and scientific notation ``a \\times 10^{n}``."""
    from sympy import Mul, Pow

    if e.is_Number:
        return True
    if isinstance(e, Pow):
        return e.base.is_Integer and e.exp == -1 and abs(e.base) > 1
    if not isinstance(e, Mul) or len(e.args) != 2:
        return False
    a, b = sorted(e.args, key=lambda x: not x.is_Number)
    if not a.is_Number:
        return False
    if a == -1:
        return _written_value(b)
    if isinstance(b, Pow) and b.base == 10 and b.exp.is_Integer and b.exp != -1:
        return 1 <= abs(a) < 10
    return (
        isinstance(b, Pow)
        and a.is_Integer
        and b.exp == -1
        and b.base.is_Integer
        and int(b.base) != 0
        and int(a) % int(b.base) != 0
    )


def needs_evaluating(e: Any) -> bool:
    """Whether a parsed answer still holds arithmetic on plain numbers (``6 + 8``,
    ``(8 + 6) \\cdot 1``, ``12 \\times 12``, ``\\sqrt{4}``, ``9^{9^{9}}``, ``5!``), which a
    value or closed form (``14``, ``-\\frac{3}{4}``, ``1.5 \\times 10^{3}``, ``2\\sqrt{3}``,
    ``\\frac{\\pi}{2}``, ``x^2 + 1``) does not. Decided on the structure, never by evaluating."""
    from sympy import Add, Mul, Pow

    if _numeric(e):
        return not _written_value(e)
    if isinstance(e, Add | Mul):
        numbers = [a for a in e.args if _numeric(a)]
        if len(numbers) > 1 and (
            isinstance(e, Add) or not _written_value(Mul(*numbers, evaluate=False))
        ):
            return True
        if len(numbers) == 1 and not _written_value(numbers[0]):
            return True
        return any(needs_evaluating(a) for a in e.args if not _numeric(a))
    if (
        isinstance(e, Pow)
        and e.base.is_Rational
        and e.exp.is_Rational
        and _exact_root(e.base, e.exp)
    ):
        return True
    return any(needs_evaluating(a) for a in getattr(e, "args", ()))


def _exact_root(base: Any, exponent: Any) -> bool:
    """Whether ``base ** exponent`` (a root of a rational) is rational, like ``\\sqrt{4}``."""
    from sympy import integer_nthroot

    p, q, k = abs(int(base.p)), int(base.q), int(exponent.q)
    if k > 64 or max(p.bit_length(), q.bit_length()) > _MAX_ROOT_BITS:
        return False
    return integer_nthroot(p, k)[1] and integer_nthroot(q, k)[1]
