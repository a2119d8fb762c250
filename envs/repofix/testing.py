"""Running a repository's tests in a sandbox with the stdlib runner, and what they did."""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vime.sandboxes import ExecResult, Sandbox


@functools.cache
def runner_source() -> str:
    """The runner program sent to the sandbox (``envs/repofix/runner.py``)."""
    return (Path(__file__).parent / "runner.py").read_text()


@dataclass
class TestRun:
    """Per-test outcomes of one run: ``results`` maps a test id to ``(outcome, detail)``;
    ``collect_errors`` maps a test file that could not be imported to its traceback;
    ``missing`` lists selected test ids that never reported (a crash or the time limit);
    ``seconds`` maps a test id to the CPU seconds it took."""

    __test__ = False  # not a pytest class

    results: dict[str, tuple[str, str]] = field(default_factory=dict)
    collect_errors: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    exec_result: ExecResult | None = None

    @property
    def passed(self) -> list[str]:
        """Ids of the tests that passed."""
        return [t for t, (outcome, _) in self.results.items() if outcome == "pass"]

    @property
    def failed(self) -> list[str]:
        """Ids of the tests that failed, files that did not import, and tests never reported."""
        failing = [t for t, (outcome, _) in self.results.items() if outcome == "fail"]
        return failing + list(self.collect_errors) + self.missing

    @property
    def total(self) -> int:
        """Tests run (skipped ones excluded), counting an unimportable file as one."""
        return len(self.passed) + len(self.failed)

    @property
    def fraction(self) -> float:
        """The fraction of tests that passed (0.0 when none ran)."""
        return len(self.passed) / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """True when at least one test ran and none failed."""
        return self.total > 0 and not self.failed and not self.timed_out

    def failure_text(self, test_id: str) -> str:
        """The traceback (or reason) of a failed test or an unimportable file."""
        if test_id in self.collect_errors:
            return self.collect_errors[test_id]
        if test_id in self.missing:
            return "the test never finished (the run crashed or timed out)"
        return self.results.get(test_id, ("", ""))[1]

    def summary(self, *, max_failures: int = 3, max_chars: int = 1500) -> str:
        """A few lines for the model: the counts, then the first failures' tracebacks."""
        head = f"{len(self.passed)} passed, {len(self.failed)} failed"
        skipped = sum(outcome == "skip" for outcome, _ in self.results.values())
        head += f", {skipped} skipped." if skipped else "."
        lines = [head]
        if self.timed_out:
            lines.append("The test run timed out and was killed (an infinite loop?).")
        for test_id in self.failed[:max_failures]:
            text = self.failure_text(test_id).strip()
            if len(text) > max_chars:
                text = "..." + text[-max_chars:]
            lines.append(f"FAILED {test_id}\n{text}")
        if len(self.failed) > max_failures:
            lines.append(f"... and {len(self.failed) - max_failures} more failing test(s).")
        if self.total == 0 and self.exec_result is not None and self.exec_result.stderr.strip():
            lines.append(self.exec_result.stderr.strip()[-max_chars:])
        return "\n".join(lines)


async def run_tests(
    box: Sandbox,
    select: Sequence[str],
    *,
    timeout: float,
    test_timeout: float = 10.0,
    files: Mapping[str, str | bytes] | None = None,
) -> TestRun:
    """Run the tests ``select``ed (``path.py``, ``path.py::Name`` or a full test id; with a
    leading ``-`` it deselects) in the sandbox's work dir, the repository root, within ``timeout`` seconds; ``files`` are written
    first (e.g. pristine copies of the test files). Each test gets ``test_timeout`` seconds."""
    nonce = secrets.token_hex(16)
    spec = {"select": list(select), "test_timeout": test_timeout}
    result = await box.run(
        # a fixed hash seed keeps set orders, and so parametrized test ids, stable across runs
        ["env", "PYTHONHASHSEED=0", "python3", "-B", "-c", runner_source()],
        timeout=timeout,
        stdin=f"{nonce}\n{json.dumps(spec)}",
        files=files,
    )
    run = TestRun(timed_out=result.timed_out, exec_result=result)
    for line in result.stdout.splitlines():
        try:
            tag, test_id, outcome, detail, seconds = json.loads(line)
        except (ValueError, TypeError):
            continue
        if tag != nonce:
            continue
        if outcome == "collect_error":
            run.collect_errors[test_id] = detail
        elif test_id not in run.results:
            run.results[test_id] = (outcome, detail)
            run.seconds[test_id] = float(seconds)
    selected_ids = [s for s in select if "::" in s and not s.startswith("-")]
    run.missing = [
        s
        for s in selected_ids
        if s not in run.results
        and s.partition("::")[0] not in run.collect_errors
        and not any(t.startswith(s + "::") or t.startswith(s + "[") for t in run.results)
    ]
    if not run.results and not run.collect_errors and not run.missing and not result.ok:
        run.missing = list(select)  # the runner itself died: nothing it was asked ran
    return run
