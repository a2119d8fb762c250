"""Two audit attacks made the way a model makes them: through MathTool-v0's python tool."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

import vime

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
TASK = {"id": "t", "question": "What is 1 + 1?", "answer": "2"}


def python_call(code: str) -> dict:
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "python", "arguments": json.dumps({"code": code})}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret-0123456789")
    env = vime.make("vime/MathTool-v0")
    env.reset(options={"task": TASK})
    yield env
    env.close()


def test_a_tool_call_cannot_read_host_secrets_from_pid_1(env):
    code = "import glob\nfor p in glob.glob('/proc/[0-9]*/environ'): print(open(p, 'rb').read())"
    observation, *_ = env.step(python_call(code))
    assert "PATH=" in observation[0]["content"]
    assert os.environ["OPENAI_API_KEY"] not in observation[0]["content"]


def test_a_fifo_left_by_a_tool_call_gives_the_next_call_an_error_not_a_hang(env):
    env.step(python_call("import os\nos.remove('main.py')\nos.mkfifo('main.py')"))
    started = time.monotonic()
    observation, reward, terminated, _, info = env.step(python_call("print(1)"))
    assert time.monotonic() - started < 10
    assert "not a regular file" in observation[0]["content"]
    assert (reward, terminated, info["tool_errors"]) == (0.0, False, 1)
