"""``vime/GuessNumber-v0``: a multi-turn guessing game with hints and per-turn rewards."""

from __future__ import annotations

import re
from typing import Any

from vime.data import validate_task
from vime.envs.base import Env
from vime.errors import EnvError
from vime.types import Message

_INTEGER = re.compile(r"-?\d+")
_MAX_DIGITS = 18  # a longer number is out of any range; int() of thousands of digits raises


def _as_guess(number: str) -> int:
    """The integer written as ``number``, clamped to +-10**18 (far outside any range)."""
    digits = number.lstrip("-")
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        return -(10**_MAX_DIGITS) if number.startswith("-") else 10**_MAX_DIGITS
    return int(number)


class GuessNumberEnv(Env):
    """Find a secret integer in ``[1, high]`` within ``max_guesses`` turns.

    Each turn the model names a number (the last integer of its reply counts) and the env
    answers "higher" or "lower". Rewards per turn: 1.0 for the secret (the game is won and
    terminates), ``hint_reward`` for a guess inside the range the hints still allow, 0.0 for a
    guess that ignores them or a reply without a number. Using the last guess without finding
    the secret also terminates: the game is lost, a state of the game itself, not a truncation.
    ``options["task"]`` may fix the secret: ``{"id": ..., "secret": 42}``.
    """

    def __init__(
        self, *, high: int = 100, max_guesses: int = 7, hint_reward: float = 0.1, **kwargs: Any
    ):
        super().__init__(**kwargs)
        if high < 2 or max_guesses < 1:
            raise ValueError(f"need high >= 2 and max_guesses >= 1, got {high} and {max_guesses}")
        self.high, self.max_guesses, self.hint_reward = high, max_guesses, hint_reward
        self.secret: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pick the secret and explain the rules."""
        super().reset(seed=seed)
        if options and options.get("task") is not None:
            task = validate_task(options["task"], ("secret",))
            self.secret, task_id = int(task["secret"]), task["id"]
        else:
            self.secret = int(self.np_random.integers(1, self.high + 1))
            task_id = f"guess-{self.high}-{self.secret}"
        self.low_bound, self.high_bound, self.guesses = 1, self.high, 0
        rules = (
            f"I am thinking of an integer between 1 and {self.high}. Guess it in at most "
            f"{self.max_guesses} turns; after each guess I say whether it is higher or lower. "
            f"Reply with your guess as a number."
        )
        return [{"role": "user", "content": rules}], {"task_id": task_id}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict]:
        """Judge one guess."""
        if self.secret is None:
            raise EnvError("call reset() before step()")
        content = self.parse_action(action).get("content") or ""
        numbers = _INTEGER.findall(content if isinstance(content, str) else str(content))
        self.guesses += 1
        left = self.max_guesses - self.guesses
        info = {"won": 0.0, "no_number": 0.0, "consistent_guess": 0.0}
        if not numbers:
            info["no_number"] = 1.0
            verdict, reward = "I found no number in your reply.", 0.0
        else:
            guess = _as_guess(numbers[-1])
            if guess == self.secret:
                info["won"] = 1.0
                reply = f"Correct! The number was {self.secret}, found in {self.guesses} guesses."
                return [{"role": "user", "content": reply}], 1.0, True, False, info
            consistent = self.low_bound <= guess <= self.high_bound
            info["consistent_guess"] = float(consistent)
            reward = self.hint_reward if consistent else 0.0
            if guess < self.secret:
                self.low_bound = max(self.low_bound, guess + 1)
                verdict = f"{guess} is too low: higher."
            else:
                self.high_bound = min(self.high_bound, guess - 1)
                verdict = f"{guess} is too high: lower."
        if left == 0:
            reply = f"{verdict} Out of guesses: the number was {self.secret}."
            return [{"role": "user", "content": reply}], reward, True, False, info
        reply = f"{verdict} {left} {'guess' if left == 1 else 'guesses'} left."
        return [{"role": "user", "content": reply}], reward, False, False, info
