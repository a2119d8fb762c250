"""RepoFix task building blocks: AST mutants, the stdlib test runner, task sets."""

from __future__ import annotations

import pytest

import vime.sandboxes
from vime.envs.repofix.build import split_of
from vime.envs.repofix.mutate import mutations, unique_edit
from vime.envs.repofix.tasks import load_task_set, write_task_set
from vime.envs.repofix.testing import run_tests

SOURCE = '''def f(items, n):
    """Docstrings are never mutated: 1 + 2."""
    total = 0
    for i in range(1, n):
        if items[i] > 3 and i != 0:
            total += items[i] * 2
    if total:
        total = max(total, n)
    return total
'''


def test_each_kind_of_mutation_is_a_minimal_edit_of_whole_lines():
    found = {(m.kind, m.start, m.new) for m in mutations("m.py", SOURCE)}
    assert ("off_by_one", 4, "    for i in range(2, n):\n") in found
    assert ("off_by_one", 4, "    for i in range(0, n):\n") in found
    assert ("comparison_swap", 5, "        if items[i] >= 3 and i != 0:\n") in found
    assert ("comparison_swap", 5, "        if items[i] > 3 and i == 0:\n") in found
    assert ("operator_swap", 5, "        if items[i] > 3 or i != 0:\n") in found
    assert ("operator_swap", 6, "            total -= items[i] * 2\n") in found
    assert ("operator_swap", 6, "            total += items[i] // 2\n") in found
    assert ("swapped_arguments", 8, "        total = max(n, total)\n") in found
    assert ("wrong_return", 9, "    return None\n") in found
    assert ("dropped_branch", 7, "") in found
    assert not any(m.start == 2 for m in mutations("m.py", SOURCE))  # the docstring


def test_every_mutant_compiles_and_differs_from_the_original():
    for m in mutations("m.py", SOURCE):
        lines = SOURCE.splitlines(keepends=True)
        assert "".join(lines[m.start - 1 : m.end]) == m.old != m.new
        mutant = "".join(lines[: m.start - 1]) + m.new + "".join(lines[m.end :])
        compile(mutant, "m.py", "exec")


def test_a_repeated_line_is_widened_with_context_until_unique():
    text = "a = 1\nx = 0\nb = 2\nx = 0\n"
    assert unique_edit(text, 4, "x = 0\n", "x = 1\n") == ("b = 2\nx = 0\n", "b = 2\nx = 1\n")
    # an insertion (the fix of a dropped branch) gets the lines around it
    assert unique_edit(text, 3, "", "if x:\n") == ("x = 0\nb = 2\n", "x = 0\nif x:\nb = 2\n")


RUNNER_TESTS = """import unittest
import pytest


class T(unittest.TestCase):
    def test_ok(self):
        self.assertTrue(True)

    @unittest.skip("not here")
    def test_skipped(self):
        pass


@pytest.mark.parametrize(("a", "b"), [(1, 1), (2, 3)])
def test_equal(a, b):
    assert a == b


def test_raises():
    with pytest.raises(ValueError, match="bad"):
        raise ValueError("bad input")


def test_prints_a_fake_result():
    print('["0", "x::y", "pass", "", 0]')
    assert False, "printed"


def test_needs_a_fixture(tmp_path):
    pass
"""


async def test_the_runner_collects_unittest_plain_and_parametrized_tests_without_pytest():
    async with vime.sandboxes.create("local") as box:
        await box.run(
            ["true"], files={"tests/test_x.py": RUNNER_TESTS, "tests/test_bad.py": "import nope\n"}
        )
        run = await run_tests(box, ["tests/test_x.py", "tests/test_bad.py"], timeout=60)
        outcomes = {t: o for t, (o, _) in run.results.items()}
        assert outcomes == {
            "tests/test_x.py::T::test_ok": "pass",
            "tests/test_x.py::T::test_skipped": "skip",
            "tests/test_x.py::test_equal[0]": "pass",
            "tests/test_x.py::test_equal[1]": "fail",
            "tests/test_x.py::test_raises": "pass",
            "tests/test_x.py::test_prints_a_fake_result": "fail",
        }
        assert (
            "ModuleNotFoundError: No module named 'nope'" in run.collect_errors["tests/test_bad.py"]
        )
        assert "assert a == b" in run.failure_text("tests/test_x.py::test_equal[1]")
        assert run.total == 6 and not run.all_passed

        picked = await run_tests(
            box,
            [
                "tests/test_x.py::test_equal",
                "-tests/test_x.py::test_equal[1]",
                "tests/test_x.py::gone",
            ],
            timeout=60,
        )
        assert picked.passed == ["tests/test_x.py::test_equal[0]"]
        assert picked.missing == ["tests/test_x.py::gone"]


def test_a_task_set_folder_round_trips_and_names_become_paths(tmp_path):
    row = {
        "id": "p-1",
        "repo": "p-1.0",
        "instruction": "fix it",
        "visible_tests": [],
        "hidden_tests": ["t.py"],
    }
    write_task_set(tmp_path, {"train": [row], "eval": []}, {"p-1.0": {"t.py": "x = 1\n"}})
    [loaded] = load_task_set(tmp_path, "train")
    assert loaded["repo"] == str(tmp_path / "repos" / "p-1.0.json.gz")
    assert load_task_set(tmp_path, "eval") == []
    with pytest.raises(ValueError, match="split must be one of"):
        load_task_set(tmp_path, "test")


def test_the_split_is_a_stable_function_of_the_task_id():
    splits = [split_of(f"pkg-{i:04d}", 0.2) for i in range(1000)]
    assert splits == [split_of(f"pkg-{i:04d}", 0.2) for i in range(1000)]
    assert 150 < splits.count("eval") < 250


PINNED_TESTS = """import os
import threading


def test_runs_on_one_cpu():
    assert len(os.sched_getaffinity(0)) == 1


def test_threads_it_starts_share_that_cpu():
    seen = []
    worker = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
    worker.start()
    worker.join()
    assert seen == [os.sched_getaffinity(0)]
"""


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_the_runner_pins_the_tests_to_one_cpu(backend):
    # Lock-heavy threaded tests cost ~10x more CPU on two cores than on one (more-itertools'
    # TestSerialize went past the 10 s limit on a 2-core box), so grading pins to one CPU.
    async with vime.sandboxes.create(backend) as box:
        await box.run(["true"], files={"tests/test_pin.py": PINNED_TESTS})
        run = await run_tests(box, ["tests/test_pin.py"], timeout=60)
        assert sorted(run.passed) == [
            "tests/test_pin.py::test_runs_on_one_cpu",
            "tests/test_pin.py::test_threads_it_starts_share_that_cpu",
        ], {t: run.failure_text(t) for t in run.failed}
