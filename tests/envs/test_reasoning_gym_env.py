"""vime/ReasoningGym-v0: reasoning-gym datasets by name and config, seeded, graded by the
package's own scorer."""

from __future__ import annotations

import pytest

import vime
from vime.errors import EnvError


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


@pytest.fixture
def env():
    env = vime.make(
        "vime/ReasoningGym-v0",
        dataset="basic_arithmetic",
        config={"min_terms": 2, "max_terms": 2},
        seed=7,
    )
    yield env
    env.close()


def test_the_right_answer_in_answer_tags_scores_one(env):
    messages, info = env.reset(seed=3)
    task = env.unwrapped.task
    assert messages[-1]["content"] == task["question"] and info["task_id"] == task["id"]
    _, reward, terminated, truncated, info = env.step(
        answer(f"Let me add.\n<answer>{task['answer']}</answer>")
    )
    assert (reward, terminated, truncated, info["correct"]) == (1.0, True, False, 1.0)


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "{answer}",  # the right value without the tags the scorer reads
        "<answer></answer>",
        "<answer>{answer} or {other}</answer>",
        "<answer>{other}</answer>",
    ],
)
def test_hostile_or_wrong_answers_score_zero(env, reply):
    env.reset(seed=3)
    task = env.unwrapped.task
    text = reply.format(answer=task["answer"], other=int(task["answer"]) + 1)
    assert env.step(answer(text))[1] == 0.0


def test_tasks_are_seeded_and_regenerate_from_their_row(env):
    rows = env.unwrapped.generate_tasks(3, seed=0)
    assert rows == env.unwrapped.generate_tasks(3, seed=0)
    other = vime.make("vime/ReasoningGym-v0", dataset="leg_counting")  # another dataset
    messages, _ = other.reset(options={"task": rows[1]})
    assert messages[-1]["content"] == rows[1]["question"]
    assert other.step(answer(f"<answer>{rows[1]['answer']}</answer>"))[1] == 1.0


def test_a_hedge_gets_the_scorers_partial_credit_only_in_score_mode():
    kwargs = {"dataset": "basic_arithmetic", "seed": 7}
    exact, partial = (
        vime.make("vime/ReasoningGym-v0", reward_mode=m, **kwargs) for m in ("exact", "score")
    )
    for env in (exact, partial):
        env.reset(seed=3)
    right = exact.unwrapped.task["answer"]
    hedge = answer(f"<answer>{right} or {int(right) + 1}</answer>")
    assert exact.step(hedge)[1] == 0.0
    _, reward, _, _, info = partial.step(hedge)
    assert 0.0 < reward == info["score"] < 1.0 and info["correct"] == 0.0


def test_score_mode_pays_the_dataset_scorers_own_value():
    env = vime.make("vime/ReasoningGym-v0", dataset="leg_counting", seed=1, reward_mode="score")
    env.reset(seed=0)
    import reasoning_gym

    entry = reasoning_gym.create_dataset("leg_counting", seed=1, size=10_000)[
        env.unwrapped.task["index"]
    ]
    wrong = str(int(entry["answer"]) + 5)
    expected = reasoning_gym.create_dataset("leg_counting", seed=1, size=10_000).score_answer(
        wrong, entry
    )
    assert env.step(answer(f"<answer>{wrong}</answer>"))[1] == expected


def test_unknown_datasets_and_config_keys_are_refused_with_the_choices():
    with pytest.raises(EnvError, match="no dataset 'leg_countin'; closest: \\['leg_counting'"):
        vime.make("vime/ReasoningGym-v0", dataset="leg_countin")
    with pytest.raises(EnvError, match="unexpected keyword argument 'bogus'"):
        vime.make("vime/ReasoningGym-v0", config={"bogus": 1})
