"""The Code-v0 test harness, run inside the sandbox as ``python3 -I -c <this file>``.

Two processes: the *judge* runs the task's tests; the answer runs in a separate *answer*
process, forked before the judge reads its job (nonce, tests, the answer's code) from stdin,
that the judge calls into. The judge writes results tagged with the nonce on a private copy
of stdout and evaluates every assert itself, on plain values decoded from the answer
process. So the answer cannot reach the reporter, its files or its exit path: calling
``report``, writing fake result lines or exiting early passes nothing. Standard library
only; no imports from vime.
"""

import builtins
import json
import math
import os
import sys
import traceback

MAX_ERROR_CHARS = 300
MAX_REPLY_BYTES = 16 << 20  # a return value bigger than this fails its test
MAX_DEPTH = 100


# --- plain values across the process boundary -----------------------------------------------
# Scalars travel as JSON scalars; containers as one-key objects, so the two never mix up.
def encode(value, depth=0):
    """A JSON-able form of a plain value (numbers, str, bytes, None and containers of them)."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value if not isinstance(value, str) else str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"x": repr(float(value))}
    if isinstance(value, complex):
        return {"c": [encode(value.real), encode(value.imag)]}
    if isinstance(value, bytes | bytearray):
        return {"b": bytes(value).hex()}
    tags = ((tuple, "t"), (list, "l"), (frozenset, "f"), (set, "s"))
    for kind, tag in tags:
        if isinstance(value, kind):
            return {tag: [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(
        f"a {type(value).__name__} cannot be compared outside the answer's process; the tests "
        f"take numbers, strings, bytes, None and lists, tuples, sets and dicts of them"
    )


def decode(data):
    """The value :func:`encode` wrote; anything else raises ValueError."""
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((tag, body),) = data.items()
        if tag == "x" and body in ("inf", "-inf", "nan"):
            return float(body)
        if tag == "c":
            return complex(decode(body[0]), decode(body[1]))
        if tag == "b":
            return bytes.fromhex(body)
        makers = {"t": tuple, "l": list, "f": frozenset, "s": set}
        if tag in makers and isinstance(body, list):
            return makers[tag](decode(v) for v in body)
        if tag == "d" and isinstance(body, list):
            return {decode(k): decode(v) for k, v in body}
    raise ValueError("not a plain value")


def describe(exc):
    return (type(exc).__name__ + (": " + str(exc) if str(exc) else ""))[:MAX_ERROR_CHARS]


def send(stream, message):
    stream.write(json.dumps(message) + "\n")
    stream.flush()


# --- the answer process ------------------------------------------------------------------------
def serve_answer(channel_in, channel_out):
    """Run the answer's code, then call its functions on request until the judge hangs up."""
    sys.stdout = sys.stderr
    namespace = {"__name__": "solution"}
    try:
        exec(compile(json.loads(channel_in.readline()), "solution.py", "exec"), namespace)
    except BaseException as exc:
        traceback.print_exc()
        send(channel_out, ["load_error", describe(exc)])
        return
    names = [n for n, v in namespace.items() if callable(v) and not isinstance(v, type(os))]
    send(channel_out, ["loaded", names])
    for line in channel_in:
        name, args, kwargs = json.loads(line)
        try:
            result = namespace[name](*decode(args), **decode(kwargs))
        except BaseException as exc:
            send(channel_out, ["raised", type(exc).__name__, describe(exc)])
            continue
        try:
            send(channel_out, ["ok", encode(result)])
        except (TypeError, ValueError, RecursionError) as exc:
            send(channel_out, ["unsendable", describe(exc)])


def drop_privileges():
    """As root the answer could read the judge's memory: become ``nobody`` when the sandbox
    has that user (in a user namespace with one uid it does not, and stays the same user)."""
    if os.geteuid() != 0:
        return
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    except OSError:
        pass


# --- the judge ---------------------------------------------------------------------------------
class AnswerFailed(Exception):
    """The answer's process raised an exception that is not a builtin one."""


class AnswerProcess:
    """The answer's process and its channel; ``call`` runs one of its functions.

    Made by forking the judge *before* it reads its job, so the answer's process never holds
    the nonce or the tests; it drops the judge's stdin (the unread job) and stdout (the
    results) at once, before any answer code runs.
    """

    def __init__(self):
        to_answer, from_judge = os.pipe()
        from_answer, to_judge = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(from_judge)
                os.close(from_answer)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(2, 1)  # the answer's prints go to stderr
                drop_privileges()
                serve_answer(os.fdopen(to_answer, "r"), os.fdopen(to_judge, "w"))
            finally:
                os._exit(0)
        os.close(to_answer)
        os.close(to_judge)
        self.channel_out = os.fdopen(from_judge, "w")
        self.channel_in = os.fdopen(from_answer, "r")

    def load(self, solution):
        """Send the answer's code; returns ["loaded", names] or ["load_error", reason]."""
        send(self.channel_out, solution)
        return self._receive()

    def kill(self):
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass

    def _receive(self):
        line = self.channel_in.readline(MAX_REPLY_BYTES)
        if not line.endswith("\n"):
            if line:
                raise AnswerFailed("the answer returned a value too large to compare")
            raise AnswerFailed("the answer's process exited")
        return json.loads(line)

    def call(self, name, args, kwargs):
        try:
            send(self.channel_out, [name, encode(list(args)), encode(kwargs)])
        except BrokenPipeError:
            raise AnswerFailed("the answer's process exited") from None
        reply = self._receive()
        if reply[0] == "ok":
            return decode(reply[1])
        if reply[0] == "raised":
            kind = getattr(builtins, reply[1], None)
            if isinstance(kind, type) and issubclass(kind, Exception):
                raise kind(reply[2].partition(": ")[2])
            raise AnswerFailed(reply[2])
        if reply[0] == "unsendable":
            raise AnswerFailed(reply[1])
        raise AnswerFailed("the answer's process broke the protocol")


def proxy(answer, name):
    def call(*args, **kwargs):
        return answer.call(name, args, kwargs)

    call.__name__ = name
    return call


def judge():
    """Fork the answer's process, read the job, run the tests, report each result."""
    try:  # our /proc files become root's: same-user processes cannot read our memory or fds
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (ImportError, OSError, AttributeError):  # no ctypes (python3-minimal), no Linux
        pass
    answer = AnswerProcess()  # before the job is read: it must never be in the answer's memory
    nonce = sys.stdin.readline().strip()
    job = json.loads(sys.stdin.read())
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def report(index, error):
        send(results, [nonce, index, error])

    namespace = {"__name__": "tests"}
    try:
        exec(compile(job["context"], "prompt.py", "exec"), namespace)  # trusted helpers
        trusted = set(namespace)
        loaded = answer.load(job["solution"])
        if loaded[0] == "load_error":
            raise AnswerFailed(loaded[1])
        for name in loaded[1]:
            if name not in trusted or name in job["called"]:
                namespace[name] = proxy(answer, name)
        exec(compile(job["preamble"], "tests.py", "exec"), namespace)
        for name, target in job["bind"].items():
            if target not in loaded[1]:
                raise NameError(f"the code defines no function {target!r}")
            namespace[name] = proxy(answer, target)
    except BaseException as exc:
        traceback.print_exc()
        report("load", describe(exc))
        answer.kill()
        return
    for index, step in enumerate(job["steps"]):
        try:
            exec(compile(step["code"], f"test_{index}.py", "exec"), namespace)
        except BaseException as exc:
            traceback.print_exc()
            if not step["counted"]:
                report("load", "test setup failed: " + describe(exc))
                break
            report(index, describe(exc))
        else:
            if step["counted"]:
                report(index, None)
    answer.kill()


if __name__ == "__main__":
    judge()
