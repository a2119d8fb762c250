"""The docker backend without an engine: option and path checks, the output framing, owner
labels, and the error when no engine answers."""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from vime.sandboxes import SandboxError, create
from vime.sandboxes import docker as docker_backend
from vime.sandboxes.docker import DockerSandbox


@pytest.fixture
def no_engine(monkeypatch, tmp_path):
    """Point the backend at a socket where no engine listens."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setattr(docker_backend, "_client", None)


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


async def test_without_an_engine_start_says_to_start_dockerd(no_engine):
    box = create("docker")
    with pytest.raises(SandboxError, match=r"no Docker engine answers .*start dockerd"):
        await box.start()
    await box.close()


async def test_a_closed_sandbox_cannot_start_again(no_engine):
    box = create("docker")
    await box.close()
    with pytest.raises(SandboxError, match="is closed; create a new one"):
        await box.start()


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "/work/../etc/passwd", "a/../../x", ""])
async def test_paths_outside_the_work_dir_are_refused_before_anything_runs(no_engine, path):
    box = DockerSandbox()
    with pytest.raises(SandboxError, match="outside the sandbox work dir"):
        await box.write_file(path, "x")
    with pytest.raises(SandboxError, match="outside the sandbox work dir"):
        await box.read_file(path)


def test_paths_under_work_are_taken_relative_to_it():
    assert docker_backend._relative("/work/a/b.py") == "a/b.py"
    assert docker_backend._relative("a/./b.py") == "a/b.py"


@pytest.mark.parametrize("option", [{"cpus": 0}, {"work_bytes": -1}, {"tmp_bytes": True}])
def test_bad_docker_options_are_refused(option):
    (name,) = option
    with pytest.raises(ValueError, match=f"option {name} must be positive"):
        DockerSandbox(**option)


@pytest.mark.parametrize("user", ["nobody", "1000:", "-1", ""])
def test_the_user_must_be_a_numeric_uid_and_gid(user):
    with pytest.raises(ValueError, match="user must be numeric"):
        DockerSandbox(user=user)


def test_unknown_limits_are_refused():
    with pytest.raises(TypeError, match="unknown sandbox limit"):
        create("docker", memory=1 << 30)


def test_limit_keywords_override_the_defaults():
    box = create("docker", timeout=5, memory_bytes=256 << 20)
    assert (box.limits.timeout, box.limits.memory_bytes) == (5, 256 << 20)
    assert box.limits.max_processes == 256


async def test_a_non_positive_timeout_is_refused(no_engine):
    with pytest.raises(ValueError, match="timeout must be positive, got 0"):
        await DockerSandbox().run("true", timeout=0)


def test_files_travel_as_a_tar_of_relative_paths():
    archive = docker_backend._tar({"main.py": "print(1)", "/work/data/in.bin": b"\x00\x01"})
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        contents = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert contents == {"main.py": b"print(1)", "data/in.bin": b"\x00\x01"}


def test_this_process_owns_its_tag_and_a_dead_process_does_not():
    assert not docker_backend._owner_dead(docker_backend.owner_tag())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = socket.gethostname()
    assert docker_backend._owner_dead(f"{host}:{child.pid}:0")
    # Same pid, other start time: the pid was reused by another process.
    assert docker_backend._owner_dead(f"{host}:{os.getpid()}:1")


def test_sandboxes_of_other_hosts_are_never_judged_dead():
    assert not docker_backend._owner_dead(f"not-{socket.gethostname()}:1:0")
    assert not docker_backend._owner_dead("")


def pump(chunks: list[bytes], cap: int, deadline: float = 5.0):
    ours, theirs = socket.socketpair()
    frames = docker_backend._Frames(cap)

    def feed() -> None:
        for chunk in chunks:
            theirs.sendall(chunk)
        theirs.close()

    threading.Thread(target=feed).start()
    try:
        end = time.monotonic() + deadline
        outcome = docker_backend._pump(ours, frames, end, threading.Event(), "unused")
    finally:
        ours.close()
    return outcome, frames.out, frames.err


def test_docker_output_frames_are_split_into_stdout_and_stderr():
    stream = frame(1, b"hello ") + frame(2, b"oops\n") + frame(1, b"world\n")
    # Cut the bytes mid-header and mid-payload: frames may straddle reads.
    outcome, out, err = pump([stream[:3], stream[3:17], stream[17:]], cap=1 << 20)
    assert outcome == "eof"
    assert (out.text(), err.text()) == ("hello world\n", "oops\n")
    assert not (out.dropped or err.dropped)


def test_output_beyond_the_cap_is_dropped_and_flagged():
    outcome, out, err = pump([frame(1, b"a" * 10), frame(1, b"b" * 10), frame(2, b"c")], cap=15)
    assert outcome == "eof"
    assert out.text() == "a" * 10 + "b" * 5
    assert out.dropped
    assert (err.text(), err.dropped) == ("c", False)


def test_reading_stops_at_the_deadline_while_the_output_stays_open():
    ours, theirs = socket.socketpair()
    frames = docker_backend._Frames(10)
    started = time.monotonic()
    try:
        outcome = docker_backend._pump(ours, frames, started + 0.3, threading.Event(), None)
    finally:
        ours.close()
        theirs.close()
    assert outcome == "deadline"
    assert 0.3 <= time.monotonic() - started < 1.0


def test_a_frame_cut_between_the_read_and_the_drain_after_the_kill_stays_whole():
    stream = frame(1, b"first\n") + frame(2, b"second\n")
    ours, theirs = socket.socketpair()
    frames = docker_backend._Frames(1 << 20)
    try:
        theirs.sendall(stream[:11])  # the first frame's header and 3 of its 6 bytes
        end = time.monotonic() + 0.3
        assert docker_backend._pump(ours, frames, end, threading.Event(), None) == "deadline"
        theirs.sendall(stream[11:])
        theirs.close()
        end = time.monotonic() + 5
        assert docker_backend._pump(ours, frames, end, threading.Event(), None) == "eof"
    finally:
        ours.close()
    assert (frames.out.text(), frames.err.text()) == ("first\n", "second\n")


class _Response:
    """The attribute path docker-py's upgraded exec socket keeps to its HTTP response."""

    def __init__(self, reader) -> None:
        self.raw = type("Raw", (), {"_fp": type("Fp", (), {"fp": reader})()})()


def test_output_read_ahead_with_the_upgrade_headers_is_not_lost():
    # A fast command's first frame can arrive with the engine's upgrade response; the HTTP
    # client's buffered reader then holds it, and the bare socket no longer does.
    ours, theirs = socket.socketpair()
    body = frame(1, b"m-61\n14\n")
    theirs.sendall(b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\n\r\n" + body)
    theirs.close()
    reader = ours.makefile("rb")
    while reader.readline() != b"\r\n":  # the client parses the headers through its buffer
        pass
    sock = type("Upgraded", (), {"_response": _Response(reader)})()
    frames = docker_backend._Frames(1 << 20)
    try:
        frames.feed(docker_backend._read_ahead(sock, ours))
        end = time.monotonic() + 5
        assert docker_backend._pump(ours, frames, end, threading.Event(), None) == "eof"
    finally:
        ours.close()
    assert frames.out.text() == "m-61\n14\n"


def test_reading_ahead_never_waits_for_output_that_has_not_come():
    ours, theirs = socket.socketpair()
    sock = type("Upgraded", (), {"_response": _Response(ours.makefile("rb"))})()
    started = time.monotonic()
    try:
        assert docker_backend._read_ahead(sock, ours) == b""
        assert docker_backend._read_ahead(object(), ours) == b""  # no HTTP response to look at
    finally:
        ours.close()
        theirs.close()
    assert time.monotonic() - started < 0.5


def test_large_stdin_arrives_whole_while_the_reader_polls_with_a_short_timeout():
    # The output reader puts a 0.1 s timeout on the socket the stdin thread sends on; a
    # command slower than that at reading its stdin must still get all of it, then its end.
    ours, theirs = socket.socketpair()
    payload = os.urandom(4 << 20)
    received = bytearray()
    try:
        ours.settimeout(docker_backend._POLL)
        docker_backend._send_then_close(ours, payload, time.monotonic() + 30)
        while chunk := theirs.recv(1 << 16):
            received += chunk
            time.sleep(0.002)
    finally:
        ours.close()
        theirs.close()
    assert bytes(received) == payload


def test_reading_ahead_leaves_the_socket_blocking_as_it_was():
    ours, theirs = socket.socketpair()
    sock = type("Upgraded", (), {"_response": _Response(ours.makefile("rb"))})()
    try:
        docker_backend._read_ahead(sock, ours)
        assert ours.gettimeout() is None
    finally:
        ours.close()
        theirs.close()


def test_a_forked_child_has_its_own_owner_tag_and_no_inherited_sandboxes(monkeypatch):
    monkeypatch.setitem(docker_backend._live, "parent-container", DockerSandbox())
    parent_tag = docker_backend.owner_tag()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports and leaves at once, without running pytest's exit code
        tag = docker_backend.owner_tag()
        os.write(write, f"{tag}|{len(docker_backend._live)}|{os.getpid()}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        tag, live, child_pid = pipe.read().split("|")
    os.waitpid(pid, 0)
    assert tag != parent_tag
    assert tag.split(":")[1] == child_pid
    assert live == "0"
    assert docker_backend.owner_tag() == parent_tag
