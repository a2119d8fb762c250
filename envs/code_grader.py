"""Grading model-written code with unit tests run in a sandbox: code extraction from a reply,
test plans (HumanEval ``check`` functions split into one test per assert), and the harness."""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.sandboxes import Sandbox

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}

# The judge and answer processes that run in the sandbox (see that file's docstring).
HARNESS = (Path(__file__).parent / "code_harness.py").read_text()
MAX_ERROR_CHARS = 300


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a model reply: a fenced Python block (the last one that defines
    ``entry_point`` when given, else the last one), else the whole text. An unclosed fence (a
    reply cut by the token limit) counts up to the end of the text."""
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    if not blocks:
        return text
    if entry_point:
        defining = [
            b
            for b in blocks
            if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\b", b, re.M)
        ]
        if defining:
            return defining[-1]
    return blocks[-1]


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


def _as_body(code: str) -> str:
    """``code`` indented as a function body: chat replies often lose the first line's indent
    (stripped text), and some bodies come with no indent at all."""
    lines = code.split("\n")
    if not lines[0] or lines[0][0].isspace():
        return code
    rest = [line for line in lines[1:] if line.strip()]
    if rest and all(line[0].isspace() for line in rest):
        return "    " + code
    return textwrap.indent(code, "    ")


def solution_source(code: str, *, prefix: str = "", entry_point: str | None = None) -> str:
    """The program to test: ``prefix`` (a HumanEval prompt: imports, helpers, the signature)
    then the answer. An answer that does not define ``entry_point`` is taken as the body that
    continues the prefix (completion style)."""
    if not prefix:
        return code
    if entry_point and not _defines(code, entry_point):
        return prefix + _as_body(code)
    return prefix + "\n\n" + code


@dataclass
class TestPlan:
    """What runs after the solution: ``preamble`` (not counted), ``bind`` (name -> defined
    name, e.g. ``candidate`` -> the entry point), then ``steps``, of which the ``counted`` ones
    are the tests. A failing uncounted step (setup) fails every test after it."""

    __test__ = False  # not a pytest class

    steps: list[dict[str, Any]]
    preamble: str = ""
    bind: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The number of tests."""
        return sum(step["counted"] for step in self.steps)


def _is_test(statement: ast.stmt) -> bool:
    # an assert of a constant (HumanEval's `assert True, "..."`) passes for any answer
    return any(
        isinstance(node, ast.Assert) and not isinstance(node.test, ast.Constant)
        for node in ast.walk(statement)
    )


def _compiles_alone(source: str) -> bool:
    try:
        compile(source, "<test>", "exec")
    except SyntaxError:  # `return`, `yield` or `nonlocal` only make sense inside check
        return False
    return True


def check_function_plan(test: str, entry_point: str) -> TestPlan:
    """A plan for HumanEval-style tests: ``test`` defines ``check(candidate)``.

    Each top-level statement of ``check``'s body that asserts something about the answer is
    one test (a loop of asserts is one test); the other statements are setup, run in order.
    When the body cannot be split (no ``check``, a ``return`` in it, no such assert) the whole
    ``check(entry_point)`` call is the single test.
    """
    whole = TestPlan(preamble=test, steps=[{"code": f"check({entry_point})", "counted": True}])
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return whole
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None or len(check.args.args) != 1:
        return whole
    steps = []
    for statement in check.body:
        source = ast.get_source_segment(test, statement) or ast.unparse(statement)
        if not _compiles_alone(source):
            return whole
        steps.append({"code": source, "counted": _is_test(statement)})
    plan = TestPlan(preamble=test, bind={check.args.args[0].arg: entry_point}, steps=steps)
    return plan if plan.total else whole


def plan_for(task: dict[str, Any]) -> TestPlan:
    """The test plan of a task: its ``tests`` (a list of statements, each one test) or its
    ``test`` code with a ``check(candidate)`` function and ``entry_point``."""
    if "tests" in task:
        return TestPlan(steps=[{"code": str(t), "counted": True} for t in task["tests"]])
    return check_function_plan(str(task["test"]), str(task["entry_point"]))


@dataclass
class TestReport:
    """How an answer did: tests passed out of ``total``, the first failures, whether the run
    timed out, and an error that stopped the tests before they ran (e.g. a SyntaxError)."""

    __test__ = False  # not a pytest class

    passed: int
    total: int
    failures: list[str]
    timed_out: bool
    load_error: str | None

    @property
    def fraction(self) -> float:
        """The fraction of tests passed (0.0 when there are none)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """True when every test passed."""
        return self.total > 0 and self.passed == self.total

    def summary(self, max_failures: int = 3) -> str:
        """A few lines for the model: the score, then what went wrong."""
        lines = [f"{self.passed}/{self.total} tests passed."]
        if self.timed_out:
            lines.append("The tests timed out: the program was killed (an infinite loop?).")
        if self.load_error:
            lines.append(f"The code could not run: {self.load_error}")
        lines += self.failures[:max_failures]
        if len(self.failures) > max_failures:
            lines.append(f"... and {len(self.failures) - max_failures} more failing test(s).")
        return "\n".join(lines)


async def run_tests(
    sandbox: Sandbox,
    solution: str,
    plan: TestPlan,
    *,
    timeout: float,
    context: str = "",
    entry_point: str | None = None,
) -> TestReport:
    """Run ``plan`` against ``solution`` in ``sandbox`` within ``timeout`` seconds (wall clock).

    The tests run in a judge process that calls the answer's functions in another process and
    compares plain values itself (see ``code_harness.py``). ``context`` (a HumanEval prompt:
    imports and helpers the tests use) is trusted and runs in the judge; ``entry_point`` and
    the plan's bound names always call the answer. Tests that passed before a timeout or a
    crash count; the rest fail. A sandbox that fails (whatever the answer did to its work dir)
    fails every test; it never raises.
    """
    nonce = secrets.token_hex(16)
    job = {
        "context": context,
        "solution": solution,
        "preamble": plan.preamble,
        "bind": plan.bind,
        "steps": plan.steps,
        "called": sorted({*plan.bind.values(), *([entry_point] if entry_point else [])}),
    }
    counted = [i for i, step in enumerate(plan.steps) if step["counted"]]
    try:
        result = await sandbox.run(
            ["python3", "-I", "-c", HARNESS],
            timeout=timeout,
            stdin=nonce + "\n" + json.dumps(job),
        )
    except Exception as exc:  # the answer may have broken its sandbox: never raise
        log.warning("the sandbox failed to run the tests: %s", exc)
        problem = f"the sandbox failed to run the tests: {type(exc).__name__}: {exc}"
        return TestReport(0, len(counted), [], False, problem[:MAX_ERROR_CHARS])
    outcomes: dict[Any, str | None] = {}
    for line in result.stdout.splitlines():
        try:
            tag, index, error = json.loads(line)
        except (ValueError, TypeError):
            continue
        if tag == nonce and index not in outcomes:
            outcomes[index] = error
    passed = sum(1 for i in counted if i in outcomes and outcomes[i] is None)
    failures = []
    for i in counted:
        if outcomes.get(i) is not None:
            failures.append(f"Failed: {plan.steps[i]['code'][:200]}\n  -> {outcomes[i]}")
    load_error = outcomes.get("load")
    if load_error is None and not outcomes and not result.timed_out and result.exit_code != 0:
        load_error = (result.stderr.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]
    return TestReport(passed, len(counted), failures, result.timed_out, load_error)
