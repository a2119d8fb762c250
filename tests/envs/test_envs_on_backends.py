"""MathTool-v0 and Code-v0 on the other sandbox backends: docker (when an engine has the sandbox
image) and remote (an in-process ``vime sandbox serve`` over the local backend)."""

from __future__ import annotations

import json
import os
import secrets

import pytest

import vime
from vime.envs.code import humaneval_tasks

TASK = {"id": "p", "question": "What is 2 to the power 64?", "answer": "18446744073709551616"}
PYTHON_CALL = '<tool_call>{"name": "python", "arguments": {"code": %s}}</tool_call>'


@pytest.fixture
def docker_options():
    """Env kwargs for the docker backend; skips where no engine has the sandbox image."""
    docker = pytest.importorskip("docker")
    image = os.environ.get("VIME_SANDBOX_IMAGE", "vime-sandbox:bookworm")
    try:
        docker.from_env(timeout=5).images.get(image)
    except Exception as exc:
        pytest.skip(f"no Docker engine with the image {image}: {exc}")
    return {"sandbox": "docker", "sandbox_options": {"image": image}}


@pytest.fixture
async def remote_options():
    """Env kwargs for the remote backend, served by a sandbox server on loopback."""
    from aiohttp import web

    from vime.sandboxes.server import SandboxServer
    from vime.sandboxes.server_config import ServerConfig

    token = secrets.token_urlsafe(24)
    runner = SandboxServer(ServerConfig(port=0), token).runner()
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield {"sandbox": "remote", "sandbox_options": {"url": f"http://{host}:{port}", "token": token}}
    await runner.cleanup()


async def code_episode(options, task, code):
    env = vime.make("vime/Code-v0", **options)
    try:
        await env.areset(options={"task": task})
        return await env.astep(f"```python\n{code}\n```")
    finally:
        env.close()


async def math_tool_episode(options):
    env = vime.make("vime/MathTool-v0", code_timeout=2.0, **options)
    try:
        await env.areset(options={"task": TASK})
        printed = await env.astep(PYTHON_CALL % json.dumps("print(2 ** 64)"))
        looped = await env.astep(PYTHON_CALL % json.dumps("while True: pass"))
        final = await env.astep(f"\\boxed{{{TASK['answer']}}}")
        return printed[0][0]["content"], looped[0][0]["content"], final[1:3]
    finally:
        env.close()


async def check_both_envs(options):
    task = humaneval_tasks()[0]
    right = task["prompt"] + task["canonical_solution"]
    assert (await code_episode(options, task, right))[1] == 1.0
    wrong = task["prompt"] + "    return None\n"
    assert (await code_episode(options, task, wrong))[1] == 0.0
    assert await math_tool_episode(options) == (
        TASK["answer"],
        "[timed out after 2 s: the program was killed]",
        (1.0, True),
    )


@pytest.mark.slow
@pytest.mark.docker
async def test_envs_run_their_code_in_docker(docker_options):
    await check_both_envs(docker_options)


@pytest.mark.slow
async def test_envs_run_their_code_on_a_remote_sandbox_server(remote_options):
    await check_both_envs(remote_options)
