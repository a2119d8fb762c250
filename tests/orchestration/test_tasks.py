"""Where a run's tasks come from: a file, or the env's seeded generator."""

from __future__ import annotations

import json

import pytest

from vime.cli.main import parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import ConfigError
from vime.orchestration.tasks import eval_tasks_for, train_tasks_for


def setup_of(*argv: str):
    return build_setup(parse_args(["train", "--model", "m", *argv]))


def test_generated_tasks_are_seeded_unique_and_held_out_from_eval() -> None:
    a = train_tasks_for(setup_of("--env", "vime/Math-v0", "--seed", "3"))
    b = train_tasks_for(setup_of("--env", "vime/Math-v0", "--seed", "3"))
    assert a == b and len({t["id"] for t in a}) == len(a) == 4096
    held_out = eval_tasks_for(setup_of("--env", "vime/Math-v0", "--seed", "3", "--eval-size", "5"))
    assert len(held_out) == 5 and held_out != a[:5]


def test_a_task_file_wins_over_the_generator(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "x", "question": "1+1?", "answer": "2"}) + "\n")
    assert train_tasks_for(setup_of("--env", "vime/Math-v0", "--tasks", str(path))) == [
        {"id": "x", "question": "1+1?", "answer": "2"}
    ]


def test_an_env_without_a_generator_asks_for_a_task_file() -> None:
    with pytest.raises(ConfigError, match="has no task generator"):
        train_tasks_for(setup_of("--env", "vime/GuessNumber-v0"))
