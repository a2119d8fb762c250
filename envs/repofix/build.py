"""Build a RepoFix task set from real packages: snapshot each sdist, keep the tests that pass
(quickly) in the sandbox, inject one AST mutation per task and keep the mutants that some
test catches. The same inputs give the same task set, byte for byte."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from vime.envs.repofix.mutate import KINDS, Mutation, mutations, unique_edit
from vime.envs.repofix.tasks import apply_edits, write_task_set
from vime.envs.repofix.testing import TestRun, run_tests
from vime.errors import VimeError

log = logging.getLogger(__name__)

# The packages of the shipped set: small, pure Python, their sdists carry their tests, and
# those tests run on the stdlib alone (with the runner's pytest stand-in).
DEFAULT_PACKAGES = (
    "cachetools==8.0.2",
    "more-itertools==11.2.1",
    "toolz==1.2.0",
    "idna==3.20",
    "boltons==26.2.0",
    "isodate==0.7.2",
    "humanize==4.17.0",
    "inflection==0.5.1",
)
TEXT_SUFFIXES = {".py", ".txt", ".json", ".cfg", ".toml", ".ini", ".rst", ".md", ".in", ".yaml"}
SKIP_DIRS = {".git", ".github", "docs", "doc", "build", "dist", "__pycache__", "benchmarks"}
MAX_FILE_BYTES = 512 << 10
# Tests that take more CPU seconds are left out so that a grading run stays short (CPU time,
# not wall time, so that the machine's load does not change which tests are kept).
SLOW_TEST_SECONDS = 0.5
# A mutant that makes a test hang is caught or not depending on the machine's load: such
# mutants are left out, so that the same inputs give the same tasks.
MUTANT_RUN_SECONDS = 600
MUTANT_TEST_SECONDS = 10
MAX_TRIES_PER_TASK = 8  # candidate mutants tried per task wanted, at most  # slower tests are left out so that one grading run stays short


class BuildError(VimeError):
    """A package cannot become RepoFix tasks (no sdist, no tests that pass here, ...)."""


@dataclass
class PackageReport:
    """What the build made of one package."""

    name: str
    version: str
    test_files: int = 0
    tests: int = 0
    candidates: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def tasks(self) -> int:
        """Tasks kept."""
        return sum(self.kinds.values())


def fetch_sdist(requirement: str, dest: Path, sdists: Path | None = None) -> Path:
    """The sdist of ``name==version``: from the folder ``sdists`` when it has it, else from
    the package index with ``pip download``."""
    name, _, version = requirement.partition("==")
    if not version:
        raise BuildError(f"pin the package version for a reproducible set: {name}==X.Y")
    stem = f"{name.replace('-', '_').lower()}-{version}"
    if sdists is not None:
        for file in sorted(sdists.glob("*.tar.gz")):
            if file.name.replace("-", "_").lower().startswith(stem.replace("-", "_")):
                return file
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    done = subprocess.run(
        [*command, "-d", str(dest), requirement], capture_output=True, text=True, check=False
    )
    found = sorted(dest.glob("*.tar.gz"))
    if done.returncode != 0 or not found:
        raise BuildError(f"could not download the sdist of {requirement}: {done.stderr[-500:]}")
    return found[0]


def snapshot(sdist: Path, workdir: Path) -> dict[str, str]:
    """The text files of an sdist (sources, tests, their data), by path from its root."""
    with tarfile.open(sdist) as tar:
        tar.extractall(workdir, filter="data")
    roots = [p for p in workdir.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise BuildError(f"{sdist.name} does not unpack to one folder")
    files = {}
    for path in sorted(roots[0].rglob("*")):
        rel = path.relative_to(roots[0])
        if (
            not path.is_file()
            or path.suffix not in TEXT_SUFFIXES
            or path.stat().st_size > MAX_FILE_BYTES
            or any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts)
        ):
            continue
        try:
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def _is_test(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return any(p in ("tests", "test", "testing") for p in parts) or parts[-1].startswith(
        ("test_", "conftest")
    )


def source_files(files: dict[str, str]) -> list[str]:
    """Python files of the package itself: not tests, not setup or tooling scripts."""
    return [
        p
        for p in files
        if p.endswith(".py")
        and not _is_test(p)
        and ("/" in p or p.rsplit(".", 1)[0] not in ("setup", "noxfile", "conftest", "tasks"))
        and not p.startswith(("examples/", "misc/", "scripts/", "tools/"))
    ]


def test_files(files: dict[str, str]) -> list[str]:
    """The test modules (``test*.py``) of the repository."""
    return [p for p in files if p.endswith(".py") and PurePosixPath(p).name.startswith("test")]


async def select_tests(box: Any, files: list[str]) -> tuple[list[str], TestRun]:
    """Selectors for the suite: the test files that import here, less the tests that fail,
    skip or take over ``SLOW_TEST_SECONDS`` of CPU on the original code (twice, so flaky ones
    go too)."""
    selectors = list(files)
    for _ in range(2):
        run = await run_tests(box, selectors, timeout=600, test_timeout=30)
        keep = [s for s in selectors if s.startswith("-") or s not in run.collect_errors]
        bad = [
            test_id
            for test_id, (outcome, _) in run.results.items()
            if outcome != "pass" or run.seconds.get(test_id, 0.0) > SLOW_TEST_SECONDS
        ]
        selectors = keep + [f"-{t}" for t in bad]
    passing = {t.partition("::")[0] for t in run.passed}
    selectors = [s for s in selectors if s.startswith("-") or s in passing]
    return selectors, run


def _timing_dependent(run: TestRun) -> bool:
    return (
        run.timed_out
        or bool(run.missing)
        or any("TestTimeout" in run.failure_text(t) for t in run.failed)
    )


def instruction(run: TestRun) -> str:
    """The issue text of a mutant: the first failing test and its traceback."""
    first = run.failed[0]
    # object addresses differ from run to run; the text must not
    trace = re.sub(r"0x[0-9a-f]{6,}", "0x...", run.failure_text(first).strip())
    lines = trace.splitlines()
    if len(lines) > 30:
        trace = "\n".join(["...", *lines[-30:]])
    more = f" (and {len(run.failed) - 1} other test(s))" if len(run.failed) > 1 else ""
    return (
        f"The test suite of this repository fails: {first}{more}.\n\n```\n{trace}\n```\n\n"
        "Find the bug in the package's source code and fix it. The tests are correct; do "
        "not change them."
    )


def _candidates(files: dict[str, str], seed: int, name: str) -> list[Mutation]:
    """All mutations of the package's sources, in a seeded order that takes the kinds in
    turn, so that each kind is represented."""
    by_kind: dict[str, list[Mutation]] = {k: [] for k in KINDS}
    for path in sorted(source_files(files)):
        for m in mutations(path, files[path]):
            by_kind[m.kind].append(m)
    rng = random.Random(f"{seed}:{name}")
    for found in by_kind.values():
        rng.shuffle(found)
    order = []
    while any(by_kind.values()):
        for kind in KINDS:
            if by_kind[kind]:
                order.append(by_kind[kind].pop())
    return order


async def build_package(
    requirement: str,
    *,
    per_package: int,
    seed: int,
    backend: str,
    sdists: Path | None,
    tmp: Path,
) -> tuple[str, dict[str, str], list[dict[str, Any]], PackageReport]:
    """The snapshot name, its files, the tasks and a report for one package."""
    import vime.sandboxes

    name, _, version = requirement.partition("==")
    report = PackageReport(name, version)
    work = tmp / name
    work.mkdir()
    files = snapshot(fetch_sdist(requirement, work, sdists), work / "src")
    repo = f"{name}-{version}"
    tasks: list[dict[str, Any]] = []
    async with vime.sandboxes.create(backend, timeout=600) as box:
        await box.run(["true"], files=files)
        selectors, baseline = await select_tests(box, test_files(files))
        if not baseline.passed:
            raise BuildError(f"no test of {requirement} passes in the {backend} sandbox")
        report.test_files = sum(not s.startswith("-") for s in selectors)
        report.tests = len(baseline.passed)
        for m in _candidates(files, seed, name)[: MAX_TRIES_PER_TASK * per_package]:
            if len(tasks) >= per_package:
                break
            report.candidates += 1
            original = files[m.path]
            try:
                patch_old, patch_new = unique_edit(original, m.start, m.old, m.new)
                fix_old, fix_new = unique_edit(
                    _replaced(original, patch_old, patch_new), m.start, m.new, m.old
                )
            except ValueError:  # a line repeated across the whole file: no unique edit
                continue
            mutant = apply_edits(files, [{"path": m.path, "old": patch_old, "new": patch_new}])
            await box.write_file(m.path, mutant[m.path])
            try:
                run = await run_tests(
                    box, selectors, timeout=MUTANT_RUN_SECONDS, test_timeout=MUTANT_TEST_SECONDS
                )
            finally:
                await box.write_file(m.path, original)
            if not run.failed or _timing_dependent(run):
                continue  # the tests do not catch it, or only a clock does: not a task
            tasks.append(
                {
                    "id": f"{name}-{len(tasks):04d}",
                    "repo": repo,
                    "patch": [{"path": m.path, "old": patch_old, "new": patch_new}],
                    "fix": [{"path": m.path, "old": fix_old, "new": fix_new}],
                    "instruction": instruction(run),
                    "visible_tests": run.failed[:3],
                    "hidden_tests": selectors,
                    "metadata": {
                        "package": name,
                        "version": version,
                        "mutation": m.kind,
                        "path": m.path,
                        "function": m.function,
                        "line": m.start,
                    },
                }
            )
            report.kinds[m.kind] += 1
            log.debug(
                "%s: task %d (%s) after %d candidates", name, len(tasks), m.kind, report.candidates
            )
    log.info("%s: %d tasks from %d candidates", requirement, len(tasks), report.candidates)
    return repo, files, tasks, report


def _replaced(text: str, old: str, new: str) -> str:
    return text.replace(old, new, 1)


def split_of(task_id: str, eval_fraction: float) -> str:
    """``eval`` for a stable ``eval_fraction`` of task ids (by hash), else ``train``."""
    bucket = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if bucket < eval_fraction else "train"


async def abuild(
    packages: Sequence[str],
    out: Path,
    *,
    per_package: int = 50,
    seed: int = 0,
    eval_fraction: float = 0.2,
    backend: str = "local",
    sdists: Path | None = None,
    jobs: int = 2,
) -> list[PackageReport]:
    """Build the task set of ``packages`` (``name==version``) into folder ``out``."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be between 0 and 1, got {eval_fraction}")
    gate = asyncio.Semaphore(jobs)
    with tempfile.TemporaryDirectory(prefix="vime-repofix-") as tmp:

        async def one(requirement: str) -> Any:
            async with gate:
                try:
                    return await build_package(
                        requirement,
                        per_package=per_package,
                        seed=seed,
                        backend=backend,
                        sdists=sdists,
                        tmp=Path(tmp),
                    )
                except BuildError as exc:  # one unusable package must not sink the others
                    log.warning("%s left out: %s", requirement, exc)
                    return None

        built = [b for b in await asyncio.gather(*(one(p) for p in packages)) if b is not None]
    if not built:
        raise BuildError(f"none of the packages gave tasks: {list(packages)}")
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for _, _, tasks, _ in built:
        for task in tasks:
            splits[split_of(task["id"], eval_fraction)].append(task)
    write_task_set(out, splits, {repo: files for repo, files, _, _ in built})
    reports = [r for *_, r in built]
    manifest = {
        "packages": [
            {
                "package": r.name,
                "version": r.version,
                "tasks": r.tasks,
                "kinds": dict(sorted(r.kinds.items())),
                "test_files": r.test_files,
                "tests": r.tests,
                "candidates": r.candidates,
            }
            for r in reports
        ],
        "splits": {k: len(v) for k, v in splits.items()},
        "seed": seed,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return reports


def build(packages: Sequence[str], out: Path, **options: Any) -> list[PackageReport]:
    """Sync :func:`abuild`."""
    return asyncio.run(abuild(packages, out, **options))


def table(reports: Sequence[PackageReport]) -> str:
    """A Markdown table: package, tasks, tests and mutation kinds."""
    rows = ["| package | tasks | tests | mutation kinds |", "|---|---|---|---|"]
    for r in reports:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.kinds.items()))
        rows.append(f"| {r.name} {r.version} | {r.tasks} | {r.tests} | {kinds} |")
    rows.append(f"| total | {sum(r.tasks for r in reports)} | | |")
    return "\n".join(rows)
