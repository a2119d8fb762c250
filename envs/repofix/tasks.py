"""RepoFix tasks: a repository snapshot, edits that put the bug in, an instruction, visible
and hidden tests; and task sets (a folder of JSONL splits plus the snapshots they share).

A task row::

    {"id": "cachetools-0007",
     "repo": "cachetools-8.0.2",           # a snapshot name, a .json.gz path, or {path: text}
     "patch": [{"path": "src/cachetools/__init__.py", "old": "...", "new": "..."}],
     "instruction": "Running the tests fails: ...",
     "visible_tests": ["tests/test_lru.py::LRUCacheTest::test_lru"],
     "hidden_tests": ["tests/test_lru.py", "tests/test_cache.py"],
     "fix": [{"path": "...", "old": "...", "new": "..."}],   # optional: the reference fix
     "metadata": {"package": "cachetools", "mutation": "comparison_swap"}}

A task set folder holds ``train.jsonl.gz`` and ``eval.jsonl.gz`` (the held-out split) and
``repos/<name>.json.gz``, each snapshot a JSON object ``{path: text}``.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vime.data import TaskFileError, validate_task

SPLITS = ("train", "eval")
SHIPPED = Path(__file__).parent / "data"


@functools.lru_cache(maxsize=32)
def load_snapshot(path: str) -> Mapping[str, str]:
    """The files of a snapshot file (``.json.gz`` or ``.json``), read once per process."""
    file = Path(path)
    if not file.is_file():
        raise TaskFileError(f"repository snapshot {path} does not exist")
    raw = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
    files = json.loads(raw)
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise TaskFileError(f"repository snapshot {path} must be a JSON object {{path: text}}")
    return files


def _edits(task: dict[str, Any], key: str, where: str) -> list[dict[str, str]]:
    edits = task.get(key) or []
    if not isinstance(edits, list) or not all(
        isinstance(e, dict) and {"path", "old", "new"} <= set(e) for e in edits
    ):
        raise TaskFileError(
            f"{where} (id {task['id']!r}): {key!r} must be a list of "
            f'{{"path", "old", "new"}} edits, got {edits!r:.200}'
        )
    return edits


def validate_repofix_task(row: Any, where: str = "task") -> dict[str, Any]:
    """Check a RepoFix row (see the module docstring) and return it."""
    task = validate_task(row, ("repo", "instruction", "hidden_tests"), where=where)
    if not isinstance(task["repo"], str | dict):
        raise TaskFileError(
            f"{where} (id {task['id']!r}): 'repo' must be a snapshot name or path, or an "
            f"object {{path: text}}, got {type(task['repo']).__name__}"
        )
    for key in ("visible_tests", "hidden_tests"):
        tests = task.get(key, [])
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
            raise TaskFileError(
                f"{where} (id {task['id']!r}): {key!r} must be a list of test selectors "
                f"('path.py', 'path.py::Name' or 'path.py::Class::test'), got {tests!r:.200}"
            )
    if not task["hidden_tests"]:
        raise TaskFileError(f"{where} (id {task['id']!r}): 'hidden_tests' is empty")
    _edits(task, "patch", where)
    _edits(task, "fix", where)
    return task


def apply_edits(files: Mapping[str, str], edits: list[dict[str, str]]) -> dict[str, str]:
    """``files`` with each edit's ``old`` text (which must occur exactly once) replaced."""
    out = dict(files)
    for edit in edits:
        path, old = edit["path"], edit["old"]
        if path not in out:
            raise TaskFileError(f"an edit names {path!r}, which is not in the repository")
        count = out[path].count(old)
        if count != 1:
            raise TaskFileError(
                f"an edit of {path!r} expects its 'old' text exactly once, found it {count} times"
            )
        out[path] = out[path].replace(old, edit["new"])
    return out


def repo_files(task: Mapping[str, Any], *, root: Path | None = None) -> dict[str, str]:
    """The repository of ``task`` before its patch: inline files, or the snapshot its ``repo``
    names (a path, or a name under ``root/repos``)."""
    repo = task["repo"]
    if isinstance(repo, dict):
        return dict(repo)
    path = Path(repo) if _is_path(repo) else (root or SHIPPED) / "repos" / f"{repo}.json.gz"
    return dict(load_snapshot(str(path)))


def _is_path(repo: str) -> bool:
    return repo.endswith((".json", ".json.gz"))


def test_paths(selectors: list[str]) -> list[str]:
    """The test files that selectors name, in order, without repeats."""
    return list(dict.fromkeys(s.partition("::")[0] for s in selectors))


def load_task_set(source: str | Path | None = None, split: str = "train") -> list[dict[str, Any]]:
    """The rows of one split of a task set folder (default: the set shipped with Vime), or of
    a JSONL file. Snapshot names become absolute paths, so each row stands alone. Read once
    per process (every env instance of a run asks for the same rows)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = Path(source) if source is not None else SHIPPED
    file = path / f"{split}.jsonl.gz" if path.is_dir() else path
    if not file.is_file():
        raise TaskFileError(
            f"{path} is not a RepoFix task set: it has no {file.name} (build one with "
            f"'vime tasks repofix --out {path}')"
        )
    return list(_load_rows(str(file.resolve()), file.stat().st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _load_rows(file: str, mtime_ns: int) -> tuple[dict[str, Any], ...]:
    from vime.data import load_tasks

    path = Path(file)
    if path.name.endswith(".jsonl.gz"):
        rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    else:
        rows = load_tasks(path)
    tasks = []
    for i, row in enumerate(rows):
        task = validate_repofix_task(row, where=f"{path} row {i + 1}")
        if isinstance(task["repo"], str) and not _is_path(task["repo"]):
            repo = (path.parent / "repos" / f"{task['repo']}.json.gz").resolve()
            task = {**task, "repo": str(repo)}
        tasks.append(task)
    return tuple(tasks)


def write_task_set(
    out: Path, splits: dict[str, list[dict[str, Any]]], repos: dict[str, dict[str, str]]
) -> None:
    """Write a task set folder (deterministic bytes: no gzip timestamps)."""
    (out / "repos").mkdir(parents=True, exist_ok=True)
    for name, files in repos.items():
        data = json.dumps(files, sort_keys=True).encode()
        (out / "repos" / f"{name}.json.gz").write_bytes(gzip.compress(data, mtime=0))
    for split, rows in splits.items():
        data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
        (out / f"{split}.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
