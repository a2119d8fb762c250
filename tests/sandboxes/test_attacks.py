"""The attacks of the sandbox audit (issue 16), on every backend available here (see
conftest.backend): each one breached containment once and must stay contained."""

from __future__ import annotations

import asyncio
import ctypes
import os
import platform
import tempfile
import time

import pytest

from vime.sandboxes import SandboxError

# Syscall numbers of the attacks (x86_64 and aarch64 uapi headers).
SYSCALLS = {
    "x86_64": {
        "keyctl": 250, "add_key": 248, "request_key": 249, "io_uring_setup": 425,
        "perf_event_open": 298, "bpf": 321, "ptrace": 101, "mount": 165, "unshare": 272,
        "setns": 308, "userfaultfd": 323, "renameat2": 316,
    },
    "aarch64": {
        "keyctl": 219, "add_key": 217, "request_key": 218, "io_uring_setup": 425,
        "perf_event_open": 241, "bpf": 280, "ptrace": 117, "mount": 40, "unshare": 97,
        "setns": 268, "userfaultfd": 282, "renameat2": 276,
    },
}  # fmt: skip
NR = SYSCALLS.get(platform.machine(), {})
needs_syscall_table = pytest.mark.skipif(
    not NR, reason=f"no syscall table for {platform.machine()}"
)
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_INVALIDATE = 10, 11, 21


async def test_host_secrets_in_the_environment_reach_no_process_inside(make_sandbox, monkeypatch):
    secret = "sk-" + os.urandom(12).hex()
    for name in ("OPENAI_API_KEY", "VIME_EVAL_API_KEY", "VIME_SANDBOX_TOKEN"):
        monkeypatch.setenv(name, secret)
    box = await make_sandbox()
    result = await box.run(
        "cat /proc/1/environ; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done"
        " 2>/dev/null | tr '\\0' '\\n'"
    )
    assert "PATH=" in result.stdout  # the scan read environments
    assert secret not in result.stdout


@needs_syscall_table
async def test_a_key_in_the_host_session_keyring_is_unreachable(make_sandbox):
    libc = ctypes.CDLL(None, use_errno=True)
    secret = os.urandom(12).hex()
    description = f"vime-test-{secret[:8]}".encode()
    key = libc.syscall(
        NR["add_key"], b"user", description, secret.encode(), 24, KEY_SPEC_SESSION_KEYRING
    )
    assert key > 0, os.strerror(ctypes.get_errno())
    try:
        box = await make_sandbox()
        code = (
            "import ctypes\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            f"key = libc.syscall({NR['keyctl']}, {KEYCTL_SEARCH}, {KEY_SPEC_SESSION_KEYRING},"
            f" b'user', {description!r}, 0)\n"
            "print('search', key, ctypes.get_errno())\n"
            "buf = ctypes.create_string_buffer(64)\n"
            f"print('read', libc.syscall({NR['keyctl']}, {KEYCTL_READ}, {key}, buf, 64), buf.raw)\n"
            f"print('clear', libc.syscall({NR['keyctl']}, 7, {KEY_SPEC_SESSION_KEYRING}))\n"
        )
        result = await box.run_code(code)
        assert result.ok, result.stderr
        assert secret not in result.stdout
        assert result.stdout.startswith("search -1 1\n")  # EPERM
        # The host's keyring still holds the key (the sandbox could not clear it).
        buf = ctypes.create_string_buffer(64)
        assert libc.syscall(NR["keyctl"], KEYCTL_READ, key, buf, 64) == 24
    finally:
        libc.syscall(NR["keyctl"], KEYCTL_INVALIDATE, key)


@needs_syscall_table
async def test_dangerous_syscalls_fail_with_eperm_and_python_still_works(make_sandbox):
    box = await make_sandbox()
    names = ["keyctl", "add_key", "request_key", "io_uring_setup", "perf_event_open", "bpf"]
    names += ["ptrace", "mount", "unshare", "setns", "userfaultfd"]
    code = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "params = ctypes.create_string_buffer(256)\n"
        "args = {'io_uring_setup': (8, params), 'perf_event_open': (params, 0, -1, -1, 0),\n"
        "        'unshare': (0x10000000,), 'keyctl': (0, -3, 0), 'ptrace': (0, 0, 0, 0)}\n"
        f"for name, nr in {dict((n, NR[n]) for n in names)!r}.items():\n"
        "    ctypes.set_errno(0)\n"
        "    ret = libc.syscall(nr, *args.get(name, (0, 0, 0, 0, 0)))\n"
        "    print(name, ret, ctypes.get_errno())\n"
    )
    result = await box.run_code(code)
    assert result.ok, result.stderr
    outcomes = dict((line.split()[0], line.split()[1:]) for line in result.stdout.splitlines())
    assert set(outcomes) == set(names)
    for name, (ret, err) in outcomes.items():
        assert ret == "-1" and err == "1", f"{name} returned {ret} (errno {err}), not EPERM"
    everyday = (
        "import asyncio, json, multiprocessing, os, socket, subprocess, sys, tempfile, threading\n"
        "with multiprocessing.Pool(2) as pool:\n"
        "    squares = pool.map(abs, [-1, -2, -3])\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "a, b = socket.socketpair(); a.send(b'pair'); print(b.recv(4).decode())\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\n"
        "print(asyncio.run(asyncio.sleep(0, 'async')), squares)\n"
        "with tempfile.TemporaryFile() as f: f.write(b'x'); f.flush(); print('tmp', os.fstat(f.fileno()).st_size)\n"
    )
    result = await box.run_code(everyday)
    assert result.ok, result.stderr
    assert result.stdout == "thread\npair\nchild\nasync [1, 2, 3]\ntmp 1\n"


WRITE_UNTIL_FULL = """
import errno, os, sys
limit, size, total, error = int(sys.argv[1]), int(sys.argv[2]), 0, None
chunk = b'x' * (1 << 20)
while total < limit and error is None:
    try:
        with open(f'blob{total}', 'wb') as f:
            for _ in range(size >> 20):
                f.write(chunk)
                total += len(chunk)
    except OSError as exc:
        error = errno.errorcode[exc.errno]
print(total >> 20, error)
"""


async def test_the_work_dir_stops_a_1500_mb_write_at_256_mb(make_sandbox):
    box = await make_sandbox()
    await box.write_file("fill.py", WRITE_UNTIL_FULL)
    result = await box.run(["python3", "fill.py", str(1500 << 20), str(32 << 20)], timeout=60)
    written, error = result.stdout.split()
    assert error == "ENOSPC", result
    assert 200 <= int(written) <= 256
    await box.run("rm -f blob*")
    assert (await box.run("echo fine > after.txt && cat after.txt")).stdout == "fine\n"


async def test_the_work_dir_stops_100k_files_at_its_inode_cap(make_sandbox):
    box = await make_sandbox()
    code = (
        "import errno, os\n"
        "made, error = 0, None\n"
        "while made < 100_000 and error is None:\n"
        "    try:\n"
        "        os.close(os.open(f'f{made}', os.O_CREAT | os.O_WRONLY))\n"
        "        made += 1\n"
        "    except OSError as exc:\n"
        "        error = errno.errorcode[exc.errno]\n"
        "print(made, error)\n"
    )
    result = await box.run_code(code, timeout=60)
    made, error = result.stdout.split()
    assert error == "ENOSPC", result
    assert int(made) < 100_000


async def test_the_work_dir_size_is_configurable(make_sandbox, backend):
    if backend == "remote":
        pytest.skip("work_bytes is an option of the server's backend, not a client limit")
    box = await make_sandbox(work_bytes=32 << 20)
    await box.write_file("fill.py", WRITE_UNTIL_FULL)
    result = await box.run(["python3", "fill.py", str(256 << 20), str(8 << 20)], timeout=60)
    written, error = result.stdout.split()
    assert (error, int(written) <= 32) == ("ENOSPC", True), result


@pytest.mark.timeout(60)  # before the fix the host's event loop blocked forever
async def test_a_fifo_left_in_the_work_dir_blocks_nothing(make_sandbox):
    box = await make_sandbox()
    await box.run("mkfifo main.py fifo")
    started = time.monotonic()
    try:
        result = await box.run_code("print('ran')")
        assert result.stdout == "ran\n"  # a backend may replace the FIFO by the file
    except SandboxError as exc:
        assert "'main.py'" in str(exc) and "not a regular file" in str(exc)
    with pytest.raises(SandboxError, match=r"'fifo' .*not a regular file"):
        await box.read_file("fifo")
    try:
        await box.write_file("fifo", "x")
        assert await box.read_file("fifo") == b"x"  # replaced by a regular file, not opened
    except SandboxError as exc:
        assert "not a regular file" in str(exc)
    assert time.monotonic() - started < 15


async def test_a_symlink_swapped_under_write_file_never_redirects_it(make_sandbox, tmp_path):
    """The attacker swaps a directory and a symlink to a host directory (RENAME_EXCHANGE, in a
    loop) while the host writes into that directory."""
    if "renameat2" not in NR:
        pytest.skip(f"no syscall table for {platform.machine()}")
    box = await make_sandbox()
    swapper = (
        "import ctypes, os, sys, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "os.mkdir('d'); os.symlink(sys.argv[1], 'l')\n"
        "print('swapping', flush=True)\n"
        "end = time.monotonic() + float(sys.argv[2])\n"
        "while time.monotonic() < end:\n"
        f"    libc.syscall({NR['renameat2']}, -100, b'd', -100, b'l', 2)\n"
    )
    await box.write_file("swap.py", swapper)
    attack = asyncio.create_task(box.run(["python3", "swap.py", str(tmp_path), "8"], timeout=30))
    await asyncio.sleep(1.0)
    writes = refused = 0
    while not attack.done():
        try:
            await box.write_file("d/planted.txt", "pwned")
            writes += 1
        except (SandboxError, OSError):  # refused (before the fix: also raw errors)
            refused += 1
        if list(tmp_path.iterdir()):
            break
    result = await attack
    assert list(tmp_path.iterdir()) == []
    assert result.stdout == "swapping\n", result
    assert writes + refused > 50


async def test_writing_into_pid_1s_output_is_capped_on_the_host(make_sandbox, backend):
    box = await make_sandbox(max_output_bytes=1 << 16)
    before = _host_log_bytes(box) if backend == "docker" else 0
    code = (
        "chunk = b'L' * (1 << 20)\n"
        "for fd in (1, 2):\n"
        "    try:\n"
        "        with open(f'/proc/1/fd/{fd}', 'wb') as f:\n"
        "            for _ in range(64):\n"
        "                f.write(chunk)\n"
        "        print('wrote', fd)\n"
        "    except OSError as exc:\n"
        "        print('refused', fd, type(exc).__name__)\n"
    )
    result = await box.run_code(code, timeout=60)
    assert len(result.stdout) <= 1 << 16 and len(result.stderr) <= 1 << 16
    if backend == "docker":
        assert _host_log_bytes(box) - before < 1 << 20


def _host_log_bytes(box) -> int:
    """Bytes of the docker container's log file on the host (0 when it has none)."""
    import docker

    path = docker.from_env().api.inspect_container(box.container_id).get("LogPath") or ""
    return os.path.getsize(path) if os.path.exists(path) else 0


async def test_a_child_that_drops_its_environment_dies_with_its_call(make_sandbox, procs):
    box = await make_sandbox()
    token = procs.token()
    spin = (
        "import os, sys\n"
        "argv = [sys.executable, '-c', 'while 1: pass', sys.argv[1]]\n"
        "os.execve(sys.executable, argv, {})\n"
    )
    escape = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, 'spin.py', sys.argv[1]], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "time.sleep(300)\n"
    )
    files = {"spin.py": spin, "escape.py": escape}
    result = await box.run(["python3", "escape.py", token], timeout=3, files=files)
    assert result.timed_out
    assert await procs.wait_gone(token, within=5) == []


async def test_errors_never_show_the_host_work_dir(make_sandbox):
    box = await make_sandbox()
    await box.run("mkdir dir && echo x > file.txt && mkfifo fifo")
    failing = {
        "read a directory": box.read_file("dir"),
        "read below a file": box.read_file("file.txt/below"),
        "write below a file": box.write_file("file.txt/below", "x"),
        "read a FIFO": box.read_file("fifo"),
        "read a missing file": box.read_file("missing/file"),
    }
    messages = []
    for what, attempt in failing.items():
        with pytest.raises((SandboxError, FileNotFoundError)) as caught:
            await attempt
        messages.append((what, str(caught.value)))
    try:  # the docker backend replaces the (empty) directory by the file
        await box.write_file("dir", "x")
    except SandboxError as exc:
        messages.append(("write over a directory", str(exc)))
    host_root = os.path.join(tempfile.gettempdir(), "vime-sandboxes")
    for what, message in messages:
        assert host_root not in message and "/var/lib/docker" not in message, (what, message)
