"""The wheel installs vime.envs/agents/sandboxes under the vime namespace and nothing top-level."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("vime-*.whl")
    return whl


def test_wheel_has_only_the_vime_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"vime"}
    assert "vime/envs/__init__.py" in names
    assert "vime/agents/__init__.py" in names
    assert "vime/sandboxes/__init__.py" in names
    assert not any(n.startswith(("agents/", "envs/", "sandboxes/")) for n in names)
    # the RepoFix task set ships as package data, so the env works offline
    assert "vime/envs/repofix/data/eval.jsonl.gz" in names
    assert "vime/envs/repofix/data/repos/cachetools-8.0.2.json.gz" in names


def test_wheel_installs_into_a_fresh_venv_with_namespaced_imports(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # The dependencies come from the dev environment, added after the wheel's own files
    # (a .pth line does not activate the dev env's editable finder).
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import importlib.util, vime, vime.envs, vime.agents, vime.sandboxes\n"
        f"assert vime.envs.__file__.startswith({str(site)!r}), vime.envs.__file__\n"
        "assert importlib.util.find_spec('agents') is None\n"
        "assert importlib.util.find_spec('envs') is None\n"
        "print('ok')\n"
    )
    result = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
