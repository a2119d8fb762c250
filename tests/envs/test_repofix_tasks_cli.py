"""``vime tasks repofix`` end to end on a small local sdist: tests kept, mutants injected,
each task solvable by its reference fix and failing as shipped."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from vime.envs.repofix.env import RepoFixEnv
from vime.envs.repofix.tasks import load_task_set

VIME = str(Path(sys.executable).parent / "vime")
FILES = {
    "minipkg-1.0/minipkg/__init__.py": (
        "def clamp(x, low, high):\n"
        "    if x < low:\n"
        "        return low\n"
        "    if x > high:\n"
        "        return high\n"
        "    return x\n\n\n"
        "def span(values):\n"
        "    return max(values) - min(values)\n"
    ),
    "minipkg-1.0/tests/test_minipkg.py": (
        "import time\n\nfrom minipkg import clamp, span\n\n\n"
        "def test_clamp():\n    assert [clamp(x, 0, 3) for x in (-1, 2, 5)] == [0, 2, 3]\n\n\n"
        "def test_span():\n    assert span([4, 1, 9]) == 8\n\n\n"
        "def test_slow():\n    end = time.process_time() + 0.6\n    while time.process_time() < end:\n        pass\n\n\n"
        "def test_broken_upstream():\n    assert clamp(1, 0, 3) == 2\n"
    ),
    "minipkg-1.0/README.md": "A tiny package.\n",
}


def sdist(folder: Path) -> None:
    with tarfile.open(folder / "minipkg-1.0.tar.gz", "w:gz") as tar:
        for name, text in FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


async def test_a_built_set_keeps_passing_fast_tests_and_only_caught_mutants(tmp_path):
    sdist(tmp_path)
    out = tmp_path / "set"
    command = [VIME, "tasks", "repofix", "--packages", "minipkg==1.0", "--sdists", str(tmp_path)]
    done = subprocess.run(
        [*command, "--out", str(out), "--per-package", "6", "--eval-fraction", "0.3"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "| minipkg 1.0 | 6 | 2 |" in done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["packages"][0]["tasks"] == 6 and sum(manifest["splits"].values()) == 6
    tasks = load_task_set(out, "train") + load_task_set(out, "eval")
    assert sorted(t["id"] for t in tasks) == [f"minipkg-{i:04d}" for i in range(6)]
    repo = json.loads(gzip.decompress((out / "repos" / "minipkg-1.0.json.gz").read_bytes()))
    assert sorted(repo) == ["README.md", "minipkg/__init__.py", "tests/test_minipkg.py"]
    # the failing and the slow upstream tests are deselected, the rest run
    assert tasks[0]["hidden_tests"] == [
        "tests/test_minipkg.py",
        "-tests/test_minipkg.py::test_slow",
        "-tests/test_minipkg.py::test_broken_upstream",
    ]
    env = RepoFixEnv(tasks=out, sandbox="local")
    for task in tasks:
        assert task["metadata"]["path"] == "minipkg/__init__.py"
        assert task["instruction"].startswith("The test suite of this repository fails: tests/")
        await env.areset(options={"task": task})
        assert (await env.grade())[0] == 0.0, task["id"]  # the bug as shipped fails
        await env.areset(options={"task": task})
        fix = task["fix"][0]
        await env.str_replace(fix["path"], fix["old"], fix["new"])
        assert (await env.grade())[0] == 1.0, task["id"]  # its reference fix passes


def test_an_unpinned_package_is_refused(tmp_path):
    done = subprocess.run(
        [VIME, "tasks", "repofix", "--packages", "minipkg", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "pin the package version for a reproducible set: minipkg==X.Y" in done.stderr
