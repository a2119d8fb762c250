"""docs/envs.md runs as written: files are saved, Python and shell blocks run in a scratch
folder in order, each output block must equal what the block before it printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "envs.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
FILE_MARKER = re.compile(r"^# (\S+\.py)\n")

# Runs every Python block in one process (imports once), each with its own globals and
# captured stdout; prints the outputs as a JSON list.
DRIVER = """
import contextlib, io, json, sys
outputs = []
for code in json.load(open(sys.argv[1])):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<docs/envs.md>", "exec"), {"__name__": "__main__"})
    outputs.append(out.getvalue())
print(json.dumps(outputs))
"""


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(DOC.read_text())]


def test_every_block_of_the_env_tutorial_runs_and_prints_what_the_doc_shows(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = str(tmp_path)
    steps: list[tuple[str, str, str | None]] = []  # (kind, code, expected output)
    for lang, body in blocks():
        if lang == "text":
            assert steps and steps[-1][2] is None, "an output block must follow a code block"
            steps[-1] = (steps[-1][0], steps[-1][1], body)
        elif lang == "python" and FILE_MARKER.match(body):
            (tmp_path / FILE_MARKER.match(body).group(1)).write_text(body)
        elif lang == "toml":
            entry_points = tomllib.loads(body)["project"]["entry-points"]["vime.envs"]
            assert all(importable(tmp_path, target) for target in entry_points.values())
        else:
            assert lang in {"python", "bash"}, f"unexpected code block language {lang!r}"
            steps.append((lang, body, None))
    assert [kind for kind, _, _ in steps].count("bash") >= 2

    python = [code for kind, code, _ in steps if kind == "python"]
    (tmp_path / "blocks.json").write_text(json.dumps(python))
    driver = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "blocks.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert driver.returncode == 0, driver.stderr
    python_outputs = iter(json.loads(driver.stdout))
    for kind, code, expected in steps:
        if kind == "python":
            output = next(python_outputs)
        else:
            run = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", code],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, f"{code}\n{run.stdout}\n{run.stderr}"
            output = run.stdout
        if expected is not None:
            assert output.rstrip() == expected.rstrip(), f"block:\n{code}"


def importable(folder: Path, target: str) -> bool:
    module = target.split(":")[0]
    return (folder / f"{module.replace('.', '/')}.py").is_file()


def test_the_tutorial_env_is_about_25_lines():
    env_file = next(body for lang, body in blocks() if lang == "python" and FILE_MARKER.match(body))
    code = [line for line in env_file.splitlines()[1:] if line.strip()]
    assert len(code) <= 28
