"""The env checker (Python API of ``vime env check``): passes good envs, names what is wrong
with bad ones."""

from __future__ import annotations

import random

import pytest

import vime
from vime.envs.checker import CHECKS, check


def results(report):
    return {r.name: r for r in report.results}


@pytest.mark.parametrize("env_id", ["vime/Math-v0", "vime/GuessNumber-v0"])
def test_builtin_envs_pass_every_check(env_id):
    report = check(env_id, episodes=4)
    assert report.ok, report.format()
    assert [r.name for r in report.results] == [name for name, _ in CHECKS]


def test_a_tool_env_passes_and_its_tool_errors_are_counted(calc_env_cls):
    report = check(calc_env_cls, episodes=4)
    assert report.ok, report.format()
    by_name = results(report)
    assert by_name["tool schemas"].detail == "3 valid schema(s)"
    assert "tool errors counted for 6" in by_name["malformed actions"].detail


def test_the_report_has_a_line_per_check_and_a_summary(calc_env_cls):
    text = check(calc_env_cls, episodes=2).format().splitlines()
    assert text[0] == "Checking CalcEnv"
    assert [line.split()[0] for line in text[1:-1]] == ["PASS"] * len(CHECKS)
    assert text[-1] == f"{len(CHECKS)} passed, 0 failed"


class Shared(vime.Env):
    """A bug on purpose: the history lives on the class, so episodes leak into each other."""

    history: list[str] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "talk"}], {}

    def step(self, action):
        self.history.append(self.parse_action(action)["content"] or "")
        return [{"role": "user", "content": f"{len(self.history)} said"}], 0.0, False, False, {}


def test_state_shared_between_episodes_fails_the_concurrency_check():
    report = check(Shared, episodes=4)
    assert not report.ok
    failed = {r.name for r in report.results if not r.ok}
    assert "concurrent episodes" in failed
    assert (
        "differs from the same episode run alone" in results(report)["concurrent episodes"].detail
    )


class Fragile(vime.Env):
    """Raises on an empty reply instead of answering it."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "say something"}], {}

    def step(self, action):
        text = self.parse_action(action)["content"]
        if not text:
            raise ValueError("empty!")
        return [], 1.0, True, False, {}


def test_an_env_that_raises_on_a_malformed_reply_fails_that_check():
    detail = results(check(Fragile))["malformed actions"]
    assert not detail.ok
    assert detail.detail == "empty reply: step raised ValueError: empty!"


class Unseeded(Fragile):
    """Draws its prompt from Python's global random, ignoring the seed."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": f"{random.random()}"}], {}


def test_ignoring_the_seed_fails_the_seeding_check():
    result = results(check(Unseeded))["seeding"]
    assert not result.ok and "same seed and actions, different reset" in result.detail


class NotJson(Fragile):
    """Puts a set into info."""

    def step(self, action):
        return [], 0.0, True, False, {"seen": {1, 2}}


def test_info_that_is_not_json_fails_the_json_check():
    result = results(check(NotJson))["JSON observations"]
    assert not result.ok and "not JSON-serialisable" in result.detail


class BadSchema(Fragile):
    """Publishes a hand-written schema with a type JSON Schema does not have."""

    @property
    def tool_schemas(self):
        parameters = {"type": "object", "properties": {"n": {"type": "integr"}}}
        return [
            {
                "type": "function",
                "function": {"name": "f", "description": "d", "parameters": parameters},
            }
        ]


def test_an_invalid_tool_schema_fails_the_schema_check():
    result = results(check(BadSchema))["tool schemas"]
    assert not result.ok and "tool 'f': parameters are not valid JSON Schema" in result.detail


class NoMessages(Fragile):
    """Opens the episode with nothing for the model to read."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [], {}


def test_an_empty_opening_fails_the_reset_check():
    result = results(check(NoMessages))["reset"]
    assert not result.ok and "reset returned no messages" in result.detail


def test_a_factory_that_does_not_make_a_vime_env_stops_after_make():
    import gymnasium

    report = check(lambda: gymnasium.make("CartPole-v1"))
    assert [(r.name, r.ok) for r in report.results] == [("make", False)]
    assert "does not subclass vime.Env" in report.results[0].detail
