"""A seeded generator of arithmetic problems whose difficulty is a knob (tasks for Math-v0)."""

from __future__ import annotations

from typing import Any

import numpy as np

DIFFICULTIES = ("easy", "medium", "hard")


def _operand(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _expression(rng: np.random.Generator, difficulty: str) -> str:
    if difficulty == "easy":  # one-digit sums: a 135M model gets some right and can learn the rest
        return f"{_operand(rng, 1, 9)} + {_operand(rng, 1, 9)}"
    if difficulty == "medium":  # two-digit +, -, or a times table
        op = str(rng.choice(["+", "-", "*"]))
        if op == "*":
            return f"{_operand(rng, 2, 12)} * {_operand(rng, 2, 12)}"
        return f"{_operand(rng, 10, 99)} {op} {_operand(rng, 10, 99)}"
    # hard: three operands, parentheses, negative results
    a, b, c = (_operand(rng, 2, 30) for _ in range(3))
    op1, op2 = (str(rng.choice(["+", "-", "*"])) for _ in range(2))
    return f"({a} {op1} {b}) {op2} {c}" if rng.random() < 0.5 else f"{a} {op1} ({b} {op2} {c})"


def arithmetic_task(rng: np.random.Generator, difficulty: str = "easy") -> dict[str, Any]:
    """One task ``{"id", "question", "answer"}`` drawn from ``rng``.

    ``difficulty``: ``"easy"`` (one-digit sums), ``"medium"`` (two-digit sums and differences,
    times tables) or ``"hard"`` (three operands with parentheses).
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {list(DIFFICULTIES)}")
    expression = _expression(rng, difficulty)
    # The expression holds only ints, + - * and parentheses, built above: eval is exact here.
    answer = eval(expression, {"__builtins__": {}})
    shown = expression.replace("*", "×")
    return {
        "id": f"arith-{difficulty}-{expression.replace(' ', '')}",
        "question": f"What is {shown}?",
        "answer": str(answer),
    }
