"""vime/Math-v0: grading with math-verify, task sources and the arithmetic generator."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import vime
from vime.data import TaskFileError
from vime.envs.arithmetic import arithmetic_task
from vime.errors import EnvError

HALF = {"id": "half", "question": "What is 1 divided by 2?", "answer": "\\frac{1}{2}"}


def answer(env, text, task=HALF):
    env.reset(seed=0, options={"task": task})
    return env.step(text)


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is \\boxed{\\frac{1}{2}}.",
        "So it is \\boxed{0.5}",
        "half of one is 1/2",
        "We get \\boxed{\\dfrac{2}{4}}",
    ],
)
def test_equivalent_forms_of_the_answer_score_one(reply):
    observation, reward, terminated, truncated, info = answer(vime.make("vime/Math-v0"), reply)
    assert (observation, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["correct"] == 1.0 and info["task_id"] == "half"


def test_boxed_answer_wins_over_later_numbers():
    reply = "\\boxed{0.5} is my answer; I checked it 3 times"
    assert answer(vime.make("vime/Math-v0"), reply)[1] == 1.0


@pytest.mark.parametrize(("reply", "extracted"), [("\\boxed{2}", "2"), ("I do not know", "")])
def test_wrong_or_missing_answers_score_zero(reply, extracted):
    _, reward, terminated, _, info = answer(vime.make("vime/Math-v0"), reply)
    assert (reward, terminated) == (0.0, True)
    assert info["correct"] == 0.0 and info["extracted_answer"] == extracted


def test_prompt_is_a_system_then_a_user_message():
    observation, info = vime.make("vime/Math-v0").reset(seed=0, options={"task": HALF})
    assert observation == [
        {"role": "system", "content": "Solve the problem. Put your final answer in \\boxed{}."},
        {"role": "user", "content": "What is 1 divided by 2?"},
    ]
    assert info == {"task_id": "half"}
    assert vime.make("vime/Math-v0", system_prompt=None).reset(options={"task": HALF})[0] == [
        {"role": "user", "content": "What is 1 divided by 2?"}
    ]


def test_tasks_from_jsonl_and_parquet_are_drawn_with_the_seed(tmp_path):
    rows = [
        {"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)
    ]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    parquet = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for path in (jsonl, parquet):
        env = vime.make("vime/Math-v0", tasks=str(path))
        drawn = [env.reset(seed=s)[1]["task_id"] for s in range(10)]
        assert drawn == [env.reset(seed=s)[1]["task_id"] for s in range(10)]
        assert len(set(drawn)) > 3 and set(drawn) <= {r["id"] for r in rows}
        task = next(r for r in rows if r["id"] == env.task["id"])
        assert env.step(f"\\boxed{{{task['answer']}}}")[1] == 1.0


def test_a_task_file_without_answers_is_rejected_with_its_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "question": "q", "answer": "1"}\n{"id": "b", "question": "q"}\n')
    with pytest.raises(TaskFileError, match=rf"{path}:2 \(id 'b'\): missing key\(s\) \['answer'\]"):
        vime.make("vime/Math-v0", tasks=str(path))


def test_a_task_option_without_a_question_is_rejected():
    with pytest.raises(TaskFileError, match=r"missing key\(s\) \['question'\]"):
        vime.make("vime/Math-v0").reset(options={"task": {"id": "x", "answer": "1"}})


def test_unknown_difficulty_is_rejected():
    with pytest.raises(ValueError, match="unknown difficulty 'trivial'; choose one of"):
        vime.make("vime/Math-v0", difficulty="trivial")


def test_easy_tasks_are_one_digit_sums_with_right_answers():
    rng = np.random.default_rng(0)
    for _ in range(50):
        task = arithmetic_task(rng, "easy")
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", task["question"]).groups())
        assert task["answer"] == str(a + b) and task["id"] == f"arith-easy-{a}+{b}"


def test_medium_and_hard_tasks_have_the_right_shape():
    rng = np.random.default_rng(1)
    medium = [arithmetic_task(rng, "medium") for _ in range(60)]
    hard = [arithmetic_task(rng, "hard") for _ in range(60)]
    assert all(re.fullmatch(r"What is \d+ [+\-×] \d+\?", t["question"]) for t in medium)
    assert all("(" in t["question"] and len(re.findall(r"\d+", t["question"])) == 3 for t in hard)
    assert any(int(t["answer"]) < 0 for t in medium + hard)
    assert np.mean([abs(int(t["answer"])) for t in hard]) > 5 * 10


def test_generated_questions_repeat_with_the_seed_and_vary_across_seeds():
    env = vime.make("vime/Math-v0", difficulty="medium")
    first = [env.reset(seed=s)[0][1]["content"] for s in range(8)]
    assert first == [env.reset(seed=s)[0][1]["content"] for s in range(8)]
    assert len(set(first)) >= 6


def test_generated_answers_are_graded_right():
    env = vime.make("vime/Math-v0", difficulty="hard")
    for seed in range(5):
        env.reset(seed=seed)
        assert env.step(f"\\boxed{{{env.task['answer']}}}")[1] == 1.0


async def test_grading_works_in_the_env_thread_pool():
    # math-verify's own timeouts use SIGALRM, which only works in the main thread
    env = vime.make("vime/Math-v0")
    await env.areset(seed=0, options={"task": HALF})
    assert (await env.astep("\\boxed{1/2}"))[1] == 1.0


def test_step_before_reset_is_an_error():
    with pytest.raises(EnvError, match="call reset\\(\\) before step\\(\\)"):
        vime.make("vime/Math-v0").step("1")


SUM = {"id": "sum", "question": "What is 1 + 6?", "answer": "7"}


@pytest.mark.parametrize(
    "reply", ["1 + 6 = x", "1 + 6 is a classic problem", "\\boxed{1+6}", "so it is 1+6"]
)
def test_restating_the_question_scores_zero(reply):
    # math-verify alone evaluates "1 + 6" to 7: echoing the question would earn full reward.
    _, reward, _, _, info = answer(vime.make("vime/Math-v0"), reply, task=SUM)
    assert reward == 0.0 and info["correct"] == 0.0
    assert info["extracted_answer"].replace(" ", "") == "1+6"


@pytest.mark.parametrize("reply", ["1 + 6 = 7", "\\boxed{7}", "It is 7.", "6 + 1 = 7"])
def test_answers_that_compute_the_value_still_score_one(reply):
    assert answer(vime.make("vime/Math-v0"), reply, task=SUM)[1] == 1.0


def test_gold_answer_that_appears_in_the_question_is_not_a_restatement():
    task = {"id": "same", "question": "Simplify 1/2 + 0 to 1/2.", "answer": "1/2"}
    assert answer(vime.make("vime/Math-v0"), "\\boxed{1/2}", task=task)[1] == 1.0


EIGHT_PLUS_SIX = {"id": "8+6", "question": "What is 8 + 6?", "answer": "14"}


@pytest.mark.parametrize(
    ("task", "reply"),
    [
        (EIGHT_PLUS_SIX, "\\boxed{6 + 8}"),
        (EIGHT_PLUS_SIX, "\\boxed{8 + 6 + 0}"),
        (EIGHT_PLUS_SIX, "\\boxed{(8 + 6) \\cdot 1}"),
        (EIGHT_PLUS_SIX, "\\boxed{\\sqrt{196}}"),
        ({"id": "sq", "question": "What is 12 × 12?", "answer": "144"}, "\\boxed{12 \\times 12}"),
        ({"id": "3", "question": "What is 17 + 25 + 8?", "answer": "50"}, "\\boxed{42 + 8}"),
        ({"id": "p", "question": "What is 32 × 32?", "answer": "1024"}, "\\boxed{2^{10}}"),
    ],
)
def test_an_expression_that_still_needs_evaluating_scores_zero(task, reply):
    _, reward, _, _, info = answer(vime.make("vime/Math-v0"), reply, task=task)
    assert (reward, info["answer_rejected"]) == (0.0, "not_a_value")


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is 7 or 8.",
        "\\boxed{7 \\text{ or } 8}",
        "\\boxed{7}, or maybe \\boxed{8}",
        "Either \\boxed{8} or \\boxed{7}",
    ],
)
@pytest.mark.parametrize("gold", ["7", "8"])
def test_several_different_final_answers_score_zero(reply, gold):
    task = {"id": gold, "question": "What is 5 + 3?", "answer": gold}
    _, reward, _, _, info = answer(vime.make("vime/Math-v0"), reply, task=task)
    assert (reward, info["answer_rejected"]) == (0.0, "several_answers")


def test_the_same_answer_boxed_twice_scores_one():
    task = {"id": "8", "question": "What is 5 + 3?", "answer": "8"}
    assert answer(vime.make("vime/Math-v0"), "\\boxed{8}, so: \\boxed{8.0}", task=task)[1] == 1.0


def test_a_row_that_asks_for_an_expression_says_so_and_gets_it_graded():
    task = {
        "id": "expand",
        "question": "Write 14 as a sum of two primes.",
        "answer": "3 + 11",
        "answer_type": "expression",
    }
    env = vime.make("vime/Math-v0")
    assert answer(env, "\\boxed{11 + 3}", task=task)[1] == 1.0
    with pytest.raises(EnvError, match="answer_type must be one of"):
        env.reset(options={"task": {**task, "answer_type": "formula"}})


@pytest.mark.parametrize(
    ("reply", "gold"),
    [
        ("\\boxed{5}" + " And that is why." * 600, "5"),  # the box is 9.6 kB from the end
        ("\\boxed{1.5e3}", "1500"),
        ("\\boxed{12 dollars}", "12"),
        ("\\boxed{12\\text{ dollars}}", "12"),
        ("\\boxed{1.5 \\times 10^{3}}", "1500"),
        ("\\boxed{-\\frac{3}{4}}", "-0.75"),
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),
        ("\\boxed{x = 1000}", "1000"),
        ("\\boxed{1,000}", "1000"),
    ],
)
def test_right_answers_in_unusual_forms_score_one(reply, gold):
    task = {"id": "t", "question": "Compute it.", "answer": gold}
    assert answer(vime.make("vime/Math-v0"), reply, task=task)[1] == 1.0


@pytest.mark.parametrize(
    "reply",
    [
        "I can answer this without a <tool_call>: 2 + 3 = \\boxed{5}",
        "<tool_call> is not needed here. \\boxed{5}",
        '<tool_call>{"name": "python", "arguments": {}}</tool_call> \\boxed{5}',
    ],
)
def test_a_reply_that_mentions_a_tool_call_tag_is_all_content(reply):
    task = {"id": "5", "question": "What is 2 + 3?", "answer": "5"}
    _, reward, _, _, info = answer(vime.make("vime/Math-v0"), reply, task=task)
    assert reward == 1.0 and "tool_calls" not in info
    assert vime.make("vime/Math-v0").parse_action(reply) == {"role": "assistant", "content": reply}


def test_maj_at_k_votes_on_the_graders_answer_classes():
    from vime.eval.metrics import maj_at_k

    task = {"id": "k", "question": "What is 10 cubed?", "answer": "1000"}
    env = vime.make("vime/Math-v0")
    replies = [
        "\\boxed{999}",
        "\\boxed{999}",
        "\\boxed{1,000}",
        "\\boxed{1000}",
        "\\boxed{x = 1000}",
    ]
    infos = [answer(env, r, task=task)[4] for r in replies]
    keys = [i["answer_key"] for i in infos]
    assert keys == ["999", "999", "1000", "1000", "1000"]
    assert maj_at_k(keys, [bool(i["correct"]) for i in infos], 5) == 1.0
    unparsable = [answer(env, r, task=task)[4] for r in ["no idea", "\\boxed{6 + 994}", "hmm"]]
    assert [i["answer_key"] for i in unparsable] == [None, None, None]
