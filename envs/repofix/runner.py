"""A stdlib-only test runner that runs inside the sandbox (whose image may lack pytest).

It collects unittest ``TestCase`` methods, plain ``test_*`` functions and ``Test*`` classes
from the test files it is given, with a small stand-in for the parts of pytest that
package suites use without fixtures (``raises``, ``warns``, ``skip``, ``mark.parametrize``,
``mark.skipif``, ``approx``). Tests that take fixtures are not collected.

Protocol: the first stdin line is a nonce, the rest a JSON spec ``{"select": [...],
"test_timeout": seconds}``. A selector is ``path.py``, ``path.py::Name`` or
``path.py::Class::method`` (``name[i]`` for the i-th parameter set); one that starts with
``-`` deselects what it names. Each result is one JSON line ``[nonce, test_id, outcome,
detail, cpu_seconds]`` on a duplicate of the original stdout (outcome: pass, fail, skip, or
``collect_error`` for a file that could not be imported), so text the code under test prints
is never taken for a result. This file is sent as ``python3 -c``.
"""

import contextlib
import importlib
import json
import math
import os
import re
import signal
import sys
import time
import traceback
import types
import unittest
import warnings

MAX_DETAIL = 2000


class Skipped(Exception):
    """Raised by ``pytest.skip``."""


class Reported(Exception):
    """A failure whose text is already formatted (unittest's own report)."""


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException so ``except Exception`` cannot eat it)."""


def _mark_decorator(name):
    def make(*args, **kwargs):
        def decorate(fn):
            marks = list(getattr(fn, "_marks", []))
            marks.append((name, args, kwargs))
            fn._marks = marks
            return fn

        if name not in ("parametrize", "skipif", "skip", "xfail") and args and callable(args[0]):
            return args[0]  # bare @pytest.mark.something
        return decorate

    return make


class _Mark:
    def __getattr__(self, name):
        return _mark_decorator(name)


class _Raises:
    def __init__(self, expected, match=None):
        self.expected, self.match = expected, match
        self.value = self.type = self.typename = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(kind, self.expected):
            return False
        if self.match is not None and not re.search(self.match, str(value)):
            raise AssertionError(f"{str(value)!r} does not match {self.match!r}")
        self.value, self.type, self.typename = value, kind, kind.__name__
        return True


def _raises(expected, *args, match=None, **kwargs):
    if args:
        with _Raises(expected, match) as ctx:
            args[0](*args[1:], **kwargs)
        return ctx
    return _Raises(expected, match)


@contextlib.contextmanager
def _warns(expected, match=None):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen
    if not any(
        issubclass(w.category, expected) and (match is None or re.search(match, str(w.message)))
        for w in seen
    ):
        raise AssertionError(f"DID NOT WARN {expected}")


class _Approx:
    def __init__(self, expected, rel=1e-6, abs=1e-12):
        self.expected, self.rel, self.abs = expected, rel, abs

    def __eq__(self, other):
        def close(a, b):
            return math.isclose(a, b, rel_tol=self.rel, abs_tol=self.abs)

        if isinstance(self.expected, list | tuple):
            return len(other) == len(self.expected) and all(
                close(a, b) for a, b in zip(other, self.expected, strict=True)
            )
        return close(other, self.expected)

    def __repr__(self):
        return f"approx({self.expected!r})"


def _skip(reason=""):
    raise Skipped(reason)


def install_pytest_stand_in():
    """Make ``import pytest`` work when the real one is missing."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        module = types.ModuleType("pytest")
        module.raises, module.warns, module.skip = _raises, _warns, _skip
        module.mark, module.approx = _Mark(), _Approx
        module.fixture = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
        module.importorskip = lambda name, *a, **k: importlib.import_module(name)
        sys.modules["pytest"] = module


def _module_name(path):
    """The dotted import name of ``path`` (a package path when every folder has __init__)."""
    parts = path[:-3].split("/")
    folder = ""
    for part in parts[:-1]:
        folder = os.path.join(folder, part)
        if not os.path.exists(os.path.join(folder, "__init__.py")):
            sys.path.insert(0, os.path.abspath(os.path.dirname(path)))
            return parts[-1]
    return ".".join(parts)


def _parameter_sets(fn):
    """``[(suffix, kwargs)]`` from the function's parametrize marks (one set when none)."""
    sets = [("", {})]
    for name, args, _ in getattr(fn, "_marks", []):
        if name != "parametrize":
            continue
        names = [n.strip() for n in args[0].split(",")] if isinstance(args[0], str) else args[0]
        expanded = []
        for suffix, kwargs in sets:
            for i, values in enumerate(args[1]):
                values = getattr(values, "values", values)
                one = isinstance(args[0], str) and len(names) == 1
                row = dict(zip(names, [values] if one else values, strict=True))
                expanded.append((f"{suffix}-{i}" if suffix else str(i), {**kwargs, **row}))
        sets = expanded
    return [(f"[{s}]" if s else "", kw) for s, kw in sets]


def _skip_reason(fn):
    for name, args, kwargs in getattr(fn, "_marks", []):
        if name == "skip" or (name == "skipif" and args and args[0]):
            return kwargs.get("reason", "skipped")
    return None


def _takes_fixtures(fn, bound, provided):
    code = fn.__code__
    wanted = code.co_varnames[bound : code.co_argcount]
    defaults = len(fn.__defaults__ or ())
    required = wanted[: len(wanted) - defaults] if defaults else wanted
    return any(name not in provided for name in required)


def collect(path):
    """``[(test_id, run)]`` of the tests in file ``path``, in file order."""
    module = importlib.import_module(_module_name(path))
    tests = []
    for name, obj in list(vars(module).items()):
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if isinstance(obj, type) and issubclass(obj, unittest.TestCase):
            for method in unittest.TestLoader().getTestCaseNames(obj):
                tests.append((f"{path}::{name}::{method}", _unittest_runner(obj, method)))
        elif isinstance(obj, type) and name.startswith("Test"):
            for method in sorted(m for m in dir(obj) if m.startswith("test")):
                fn = getattr(obj, method)
                if callable(fn) and hasattr(fn, "__code__"):
                    for suffix, kwargs in _parameter_sets(fn):
                        if not _takes_fixtures(fn, 1, kwargs):
                            test_id = f"{path}::{name}::{method}{suffix}"
                            tests.append((test_id, _method_runner(obj, method, kwargs)))
        elif isinstance(obj, types.FunctionType) and name.startswith("test"):
            for suffix, kwargs in _parameter_sets(obj):
                if not _takes_fixtures(obj, 0, kwargs):
                    tests.append((f"{path}::{name}{suffix}", _function_runner(obj, kwargs)))
    return tests


def _function_runner(fn, kwargs):
    def run():
        reason = _skip_reason(fn)
        if reason:
            raise Skipped(reason)
        fn(**kwargs)

    return run


def _method_runner(cls, method, kwargs):
    def run():
        reason = _skip_reason(getattr(cls, method))
        if reason:
            raise Skipped(reason)
        instance = cls()
        if hasattr(instance, "setup_method"):
            instance.setup_method(getattr(instance, method))
        try:
            getattr(instance, method)(**kwargs)
        finally:
            if hasattr(instance, "teardown_method"):
                instance.teardown_method(getattr(instance, method))

    return run


def _unittest_runner(cls, method):
    def run():
        result = unittest.TestResult()
        cls.setUpClass()
        try:
            cls(method).run(result)
        finally:
            cls.tearDownClass()
        if result.skipped:
            raise Skipped(result.skipped[0][1])
        problems = result.failures + result.errors
        if problems:
            raise Reported(problems[0][1])
        if result.unexpectedSuccesses:
            raise AssertionError("unexpected success of a test marked expectedFailure")

    return run


def _matches(test_id, selector):
    return test_id == selector or test_id.startswith((selector + "::", selector + "["))


def _selected(test_id, names):
    path = test_id.partition("::")[0]
    return "" in names or any(_matches(test_id, f"{path}::{n}") for n in names)


def _format(exc):
    """The traceback of ``exc`` without the runner's own frames (this file runs as -c)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _on_alarm(signum, frame):
    raise TestTimeout()


def _pin_to_one_cpu():
    """Run on one CPU. Threaded tests that contend for a lock cost far more on several cores
    (more-itertools' TestSerialize::test_concurrent_calls: 1.2 s on one core, 12 s of CPU on
    two), so without this a test's cost, and whether it meets the time limit, depends on the
    machine's core count. Which CPU follows the pid, so parallel runs spread out."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[os.getpid() % len(cpus)]})
    except (AttributeError, OSError, IndexError):
        pass  # not Linux, or not allowed: run as is


def main():
    nonce = sys.stdin.readline().strip()
    spec = json.loads(sys.stdin.read())
    results = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # what the code under test prints is not a result
    for root in ("src", ""):
        if root == "" or os.path.isdir(root):
            sys.path.insert(0, os.path.abspath(root))
    _pin_to_one_cpu()
    install_pytest_stand_in()
    signal.signal(signal.SIGALRM, _on_alarm)
    limit = max(1, int(spec.get("test_timeout", 10)))

    def report(test_id, outcome, detail="", seconds=0.0):
        line = [nonce, test_id, outcome, detail[-MAX_DETAIL:], round(seconds, 4)]
        results.write(json.dumps(line) + "\n")
        results.flush()

    by_file, excluded = {}, []
    for selector in spec["select"]:
        if selector.startswith("-"):
            excluded.append(selector[1:])
        else:
            path, _, name = selector.partition("::")
            by_file.setdefault(path, set()).add(name)
    for path, names in by_file.items():
        try:
            tests = collect(path)
        except BaseException:
            report(path, "collect_error", _format(sys.exc_info()[1]))
            continue
        for test_id, run in tests:
            if not _selected(test_id, names) or any(_matches(test_id, x) for x in excluded):
                continue
            start = (
                time.process_time()
            )  # CPU time: unlike wall time, the machine's load leaves it be
            signal.alarm(limit)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    run()
            except (Skipped, unittest.SkipTest) as exc:
                outcome, detail = "skip", str(exc)
            except TestTimeout:
                outcome, detail = "fail", f"TestTimeout: the test ran over {limit} s"
            except Reported as exc:
                outcome, detail = "fail", str(exc)
            except BaseException as exc:
                outcome, detail = "fail", _format(exc)
            else:
                outcome, detail = "pass", ""
            finally:
                signal.alarm(0)
            report(test_id, outcome, detail, time.process_time() - start)


if __name__ == "__main__":
    main()
