"""Hostile code stays contained, on every backend available here (see conftest.backend)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest


async def test_infinite_loop_ends_at_the_timeout_with_no_process_left(make_sandbox, procs):
    box = await make_sandbox()
    token = procs.token()
    code = (
        "import subprocess, sys\n"
        "for _ in range(3):\n"
        "    subprocess.Popen([sys.executable, '-c', 'while True: pass', sys.argv[1]])\n"
        "while True: pass\n"
    )
    await box.write_file("loop.py", code)
    started = time.monotonic()
    result = await box.run(["python3", "loop.py", token], timeout=1.5)
    elapsed = time.monotonic() - started
    assert result.timed_out
    assert result.exit_code == -9
    assert 1.5 <= elapsed < 10.0  # the 1.5 s limit, not the 30 s default; CI may be loaded
    assert await procs.wait_gone(token) == []


async def test_fork_bomb_is_contained_and_the_host_stays_responsive(make_sandbox, procs):
    box = await make_sandbox(max_processes=48)
    token = procs.token()
    bomb = (
        "import os, sys, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    await box.write_file("bomb.py", bomb)
    run = asyncio.create_task(box.run(["python3", "bomb.py", token], timeout=4))
    await asyncio.sleep(2.0)
    peak = len(procs.live(token))
    started = time.monotonic()
    probe = await asyncio.create_subprocess_exec("true")
    await probe.wait()
    host_latency = time.monotonic() - started
    result = await run
    assert result.timed_out
    assert 1 <= peak <= 48 + 2  # the limit, plus launchers outside the sandbox (bwrap's)
    assert host_latency < 2.0
    assert await procs.wait_gone(token) == []


async def test_memory_hog_is_killed_and_reported(make_sandbox):
    box = await make_sandbox(memory_bytes=256 << 20)
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"
    result = await box.run_code(hog, timeout=20)
    assert not result.timed_out
    assert not result.ok
    # An rlimit makes the allocation fail (MemoryError); a cgroup limit OOM-kills (137).
    assert "MemoryError" in result.stderr or result.exit_code in (137, -9)


async def test_connection_to_a_host_loopback_listener_fails(make_sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    box = await make_sandbox()
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('failed', type(exc).__name__)\n"
    )
    try:
        result = await box.run_code(code, timeout=10)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert result.stdout.startswith("failed"), result


async def test_writing_outside_the_work_dir_fails(make_sandbox, procs):
    box = await make_sandbox()
    name = procs.token()
    targets = [f"/{name}", f"/usr/{name}", f"/etc/{name}", f"/home/{name}", f"/var/{name}"]
    code = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print('wrote', path)\n"
        "    except OSError:\n"
        "        print('refused', path)\n"
        "open('/work/inside.txt', 'w').write('ok')\n"
    )
    await box.write_file("w.py", code)
    result = await box.run(["python3", "w.py", *targets])
    assert result.ok, result
    assert result.stdout.split("\n")[:-1] == [f"refused {t}" for t in targets]
    assert await box.read_file("inside.txt") == b"ok"
    assert not any(Path(t).exists() for t in targets)


async def test_a_host_file_outside_the_sandbox_is_not_readable(make_sandbox, procs, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(procs.token())
    secret.chmod(0o644)
    box = await make_sandbox()
    result = await box.run(f"cat {secret} /proc/1/root{secret}; ls {tmp_path}")
    assert secret.read_text() not in result.stdout
    assert result.exit_code != 0
    assert "No such file or directory" in result.stderr


async def test_a_100_mb_output_is_truncated_and_flagged(make_sandbox):
    box = await make_sandbox(max_output_bytes=1 << 20)
    code = (
        "import sys\n"
        "chunk = b'y' * (1 << 20)\n"
        "for _ in range(100):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "print('done', file=sys.stderr)\n"
    )
    result = await box.run_code(code, timeout=60)
    assert result.ok, result.stderr
    assert result.truncated
    assert result.stdout == "y" * (1 << 20)
    assert result.stderr == "done\n"


async def test_a_daemonised_child_is_gone_after_close(make_sandbox, procs):
    box = await make_sandbox()
    token = procs.token()
    daemon = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.closerange(0, 3)\n"
        "        time.sleep(300)\n"
        "    os._exit(0)\n"
        "print('parent done')\n"
    )
    await box.write_file("d.py", daemon)
    result = await box.run(["python3", "d.py", token], timeout=10)
    assert result.ok
    assert result.stdout == "parent done\n"
    assert result.duration < 5
    await box.close()
    assert await procs.wait_gone(token) == []


async def test_cancelling_a_call_kills_its_processes(make_sandbox, procs):
    box = await make_sandbox()
    token = procs.token()
    call = asyncio.create_task(box.run(["python3", "-c", "import time; time.sleep(300)", token]))
    deadline = time.monotonic() + 20
    while not procs.live(token) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await procs.wait_gone(token, within=5) == []
    assert (await box.run("echo still usable")).stdout == "still usable\n"


async def test_stdin_files_and_exit_code_reach_the_command(make_sandbox):
    box = await make_sandbox()
    result = await box.run(
        "tr a-z A-Z < in.txt; cat -; exit 3", stdin="from stdin", files={"in.txt": "abc\n"}
    )
    assert result.stdout == "ABC\nfrom stdin"
    assert result.exit_code == 3
    assert not result.timed_out


async def test_an_argv_list_is_not_shell_interpreted(make_sandbox):
    box = await make_sandbox()
    result = await box.run(["echo", "$HOME; rm -rf /"])
    assert result.stdout == "$HOME; rm -rf /\n"


async def test_files_persist_between_calls_of_one_sandbox(make_sandbox):
    box = await make_sandbox()
    await box.run("mkdir -p out && echo 42 > out/answer")
    assert await box.read_file("out/answer") == b"42\n"
    assert (await box.run_code("print(open('out/answer').read().strip())")).stdout == "42\n"


async def test_reading_a_missing_file_raises_file_not_found(make_sandbox):
    box = await make_sandbox()
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        await box.read_file("nope.txt")


async def test_an_unknown_language_is_refused(make_sandbox):
    box = await make_sandbox()
    with pytest.raises(ValueError, match="unsupported language 'cobol'"):
        await box.run_code("DISPLAY 'HI'", language="cobol")
