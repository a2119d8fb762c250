"""Faults on purpose: run `vime train` (tiny model, CPU), inject one fault per run, count what survived.

Each run starts ``vime train`` as a user would, with a marker in its environment that every
process it starts inherits (Ray, trainer, engines, router, grader workers), injects one fault at a
random point of a step, recovers as a user would (``--resume`` where the run had to stop) and
then counts, from what the run wrote:

- finished: the run (after a resume, if one was needed) trained every step;
- lost silently: episodes of a trained step that are in no step's dump, or failed without a
  reason (each step's dump must hold every episode, trained or failed with its reason);
- steps trained twice: steps whose samples the final lineage (``trained_samples.jsonl``) holds twice;
- steps lost: steps done before the fault that had to be done again after it;
- recover_s: from the fault to the next finished step;
- leftovers: processes carrying the run's marker still alive after it ended.

    python bench/faults.py --faults all --repeats 3 --modes sync,async --out runs/faults

The slow tests in ``tests/faults/`` run one case of each fault through :func:`run_fault`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vime.inference.engines import SERVER_MODULE
from vime.orchestration.reaper import _read as read_bytes
from vime.orchestration.reaper import pid_alive

ROOT = Path(__file__).resolve().parents[1]
MARK = "VIME_FAULT_RUN"
TASKS = 64
ENV_ID = "fault_env:bench/FaultyParity-v0"


@dataclass
class Outcome:
    """What one faulty run left behind (see the module docstring)."""

    fault: str
    mode: str
    point: str = ""
    finished: bool = False
    lost_silently: int = 0
    failed_with_reason: int = 0
    steps_twice: int = 0
    steps_lost: int = 0
    since_checkpoint: int = 0  # steps done since the last checkpoint when the fault hit
    recover_s: float | None = None
    leftovers: int = 0
    message: str = ""
    extra: dict = field(default_factory=dict)


class Run:
    """One `vime train` command line over an output folder, started and watched."""

    def __init__(self, work: Path, mode: str, steps: int = 4, faults: dict | None = None) -> None:
        self.work, self.mode, self.steps = work, mode, steps
        self.out = work / "run"
        self.marker = uuid.uuid4().hex
        self.model = _tiny_model(work.parent / "tiny")
        self.tasks = work / "tasks.jsonl"
        rows = [
            {"id": f"t{i}", "question": f"What is {i} + {i % 7}?", "answer": str(i + i % 7)}
            for i in range(TASKS)
        ]
        for i, fault in (faults or {}).items():
            rows[i]["fault"] = fault
        work.mkdir(parents=True, exist_ok=True)
        self.tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.drivers: list[int] = []  # pids of every `vime train` started (sandbox owners)
        self.extra_args: tuple[str, ...] = ()
        self.left_behind: list[str] = []  # command lines of the leftovers found, for the report
        self.cleared_s = 0.0  # how long the last leftovers() waited for the run's processes

    def argv(self, *extra: str) -> list[str]:
        return [
            sys.executable, "-m", "vime", "train", "--model", str(self.model), "--env", ENV_ID,
            "--tasks", str(self.tasks), "--output-dir", str(self.out), "--mode", self.mode,
            "--rollout-batch-size", "2", "--n", "2", "--max-tokens", "8", "--max-turns", "1",
            "--lr", "1e-3", "--vllm-max-model-len", "256", "--vllm-enforce-eager",
            "--num-steps", str(self.steps), "--save-interval", "2", *self.extra_args, *extra,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(ROOT / "bench"), os.environ.get("PYTHONPATH", "")])
        return {**os.environ, MARK: self.marker, "HF_HUB_OFFLINE": "1",
                "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}  # fmt: skip

    def start(self, *extra: str) -> subprocess.Popen:
        log = self.work / f"log{len(self.logs)}.txt"
        self.logs.append(log)
        self.proc = subprocess.Popen(
            self.argv(*extra), stdout=log.open("w"), stderr=subprocess.STDOUT, env=self.env(),
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        self.drivers.append(self.proc.pid)
        return self.proc

    def wait(self, timeout: float = 900) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def log_text(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def rows(self) -> list[dict]:
        return _jsonl(self.out / "metrics.jsonl")

    def steps_done(self) -> int:
        return max((r["step"] for r in self.rows()), default=0)

    def checkpoint_step(self) -> int:
        name = _read(self.out / "checkpoints" / "latest")
        return int(name.split("_")[1]) if name else 0

    def processes(self, pattern: bytes = b"") -> list[int]:
        """Live processes carrying this run's marker whose command line contains ``pattern``."""
        needle = f"{MARK}={self.marker}".encode()
        return [
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit()
            and needle in read_bytes(f"/proc/{p}/environ")
            and pid_alive(int(p))
            and pattern in read_bytes(f"/proc/{p}/cmdline")
        ]

    def containers(self) -> list[str]:
        """Docker sandbox containers (running or not) that this run's drivers created."""
        if not self.drivers or "sandbox" not in " ".join(self.extra_args):
            return []
        fmt = '{{.ID}} {{.Label "vime.owner"}}'
        listed = subprocess.run(
            ["docker", "ps", "-a", "--filter", "label=vime.sandbox=1", "--format", fmt],
            capture_output=True, text=True, check=False,
        ).stdout.split("\n")  # fmt: skip
        owners = tuple(f"{os.uname().nodename}:{pid}:" for pid in self.drivers)
        return [
            line.split()[0]
            for line in listed
            if line.split()[1:2] and line.split()[1].startswith(owners)
        ]

    def leftovers(self, grace_s: float = 20.0) -> int:
        """Processes and containers of this run still there ``grace_s`` after it ended
        (then removed, so that they do not disturb the next run)."""
        start = time.monotonic()
        while (self.processes() or self.containers()) and time.monotonic() < start + grace_s:
            time.sleep(0.25)
        self.cleared_s = round(time.monotonic() - start, 1)
        left, boxes = self.processes(), self.containers()
        self.left_behind += [
            read_bytes(f"/proc/{p}/cmdline")[:80].decode(errors="replace") for p in left
        ]
        for pid in left:
            _signal(pid, signal.SIGKILL)
        if boxes:
            subprocess.run(["docker", "rm", "-f", *boxes], capture_output=True, check=False)
        return len(left) + len(boxes)

    def kill_driver(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def _tiny_model(path: Path) -> Path:
    if not (path / "config.json").exists():
        from vime.models.tiny import build_tiny_model

        build_tiny_model(path, family="qwen2", seed=0)
    return path


def _read(path: str | Path) -> str:
    return read_bytes(str(path)).decode(errors="replace").strip()


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    poll: float = 0.2,
    alive: Run | None = None,
):
    """Poll ``predicate`` until it is truthy; with ``alive``, fail at once if that run ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if alive is not None and alive.proc is not None and alive.proc.poll() is not None:
            raise RuntimeError(
                f"the run ended (exit {alive.proc.returncode}) while waiting for {what}; "
                f"its log ends: {alive.log_text()[-600:]!r}"
            )
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# -- accounting ---------------------------------------------------------------------------
def account(run: Run, outcome: Outcome, fault_at: float | None) -> Outcome:
    """Fill the counts of ``outcome`` from what ``run`` wrote."""
    outcome.finished = run.steps_done() >= run.steps and run.proc is not None and run.wait() == 0
    trained = _jsonl(run.out / "trained_samples.jsonl")
    per_sample = Counter(r["sample_id"] for r in trained)
    outcome.steps_twice = len({r["step"] for r in trained if per_sample[r["sample_id"]] > 1})
    expected = 2 * 2  # --rollout-batch-size x --n
    for step in range(1, run.steps_done() + 1):
        dump = _jsonl(run.out / "trajectories" / f"step_{step:06d}.jsonl")
        failed = [t for t in dump if t.get("status") in ("failed", "aborted")]
        outcome.failed_with_reason += sum(1 for t in failed if t.get("error"))
        timeouts = sum(t.get("metrics", {}).get("grader_timeout", 0) for t in dump)
        outcome.extra["grader_timeouts"] = outcome.extra.get("grader_timeouts", 0) + timeouts
        outcome.lost_silently += max(0, expected - len(dump))
        outcome.lost_silently += sum(1 for t in failed if not t.get("error"))
    if fault_at is not None:
        later = [r["time"] for r in run.rows() if r["time"] > fault_at]
        outcome.recover_s = round(min(later) - fault_at, 1) if later else None
    outcome.leftovers = run.leftovers()
    if run.left_behind:
        outcome.extra["left_behind"] = run.left_behind
    return outcome


def _steps_redone(run: Run, before: int) -> int:
    """Steps logged before a restart that the restart logged again."""
    steps = [r["step"] for r in run.rows()]
    return sum(1 for s in set(steps) if steps.count(s) > 1 and s <= before)


# -- faults ---------------------------------------------------------------------------------
def _mid_step(
    run: Run,
    rng: random.Random,
    find: Callable[[], object] | None = None,
    timeout: float = 600,
    max_delay: float = 1.0,
) -> tuple[object, str]:
    """Wait until step 1 is logged, look up the fault's target with ``find`` (every process of
    the run is up then), wait a random fraction of a step, and return the target and a label
    naming the step the fault lands in.

    The target is looked up before the delay and the delay stays under one step (a tiny
    model's step takes about 1.3 s): on a fast machine the last steps go by within seconds
    of step 1, and a fault drawn later would find the run finished (CI saw this)."""
    wait_for(lambda: run.steps_done() >= 1, timeout, "step 1", alive=run)
    target = wait_for(find, 60, "the fault's target", alive=run) if find else None
    delay = rng.uniform(0.0, max_delay)
    time.sleep(delay)
    if run.proc is not None and run.proc.poll() is not None:
        raise RuntimeError(f"the run ended before the fault, {delay:.1f}s after step 1: missed")
    return target, f"step {run.steps_done() + 1} +{delay:.1f}s"


ENGINE = SERVER_MODULE.encode()  # an engine's API server, found by its command line


def _kill_process(pattern: bytes, sig: int = signal.SIGKILL) -> Callable:
    def inject(run: Run, rng: random.Random, o: Outcome) -> float:
        pids, o.point = _mid_step(run, rng, lambda: run.processes(pattern))
        for pid in pids[:1]:
            _signal(pid, sig)
        return time.time()

    return inject


def _kill_mid_rollout(pattern: bytes) -> Callable:
    """kill -9 of the process matching ``pattern`` (the engine, or the router in front of it)
    while the engine generates: after step 1 and a random delay, at the next moment the
    engine's /metrics shows a running request (a tiny model's rollout lasts a fraction of a
    second, so a plain random moment mostly falls between rollouts)."""

    def inject(run: Run, rng: random.Random, o: Outcome) -> float:
        def targets() -> tuple[list[int], list[int]] | None:
            engines, victims = run.processes(ENGINE), run.processes(pattern)
            return (engines, victims) if engines and victims else None

        (engines, victims), _ = _mid_step(run, rng, targets, max_delay=0.5)
        argv = read_bytes(f"/proc/{engines[0]}/cmdline").split(b"\0")
        url = f"http://127.0.0.1:{int(argv[argv.index(b'--port') + 1])}/metrics"

        def generating() -> bool:
            if run.proc is not None and run.proc.poll() is not None:
                raise RuntimeError("the run ended before a request ran on the engine: missed")
            return _requests_running(url) > 0

        wait_for(generating, 120, "a request running on the engine", poll=0.02)
        _signal(victims[0], signal.SIGKILL)
        o.extra["steps_at_fault"] = run.steps_done()
        # Where the kill landed, not where the wait began: the first running request seen is
        # often a later step's rollout.
        o.point = f"step {o.extra['steps_at_fault'] + 1} rollout"
        return time.time()

    return inject


def _requests_running(metrics_url: str) -> float:
    import urllib.request

    try:
        text = urllib.request.urlopen(metrics_url, timeout=2).read().decode()
    except OSError:
        return 0.0
    rows = [x for x in text.splitlines() if x.startswith("vllm:num_requests_running")]
    return sum(float(x.rsplit(" ", 1)[1]) for x in rows)


def _hang_engine(hang_s: float) -> Callable:
    def inject(run: Run, rng: random.Random, o: Outcome) -> float:
        pids, o.point = _mid_step(run, rng, lambda: run.processes(ENGINE))
        group = os.getpgid(pids[0])  # the engine's own session: its EngineCore too
        os.killpg(group, signal.SIGSTOP)
        at = time.time()
        time.sleep(hang_s)
        os.killpg(group, signal.SIGCONT)
        o.extra["hang_s"] = hang_s
        return at

    return inject


def _poisoned_tasks(run: Run, rng: random.Random, o: Outcome) -> None:
    """Nothing to do while the run goes: its env injects the fault into some episodes."""
    o.point = "30% of episodes"


def _kill_container(run: Run, rng: random.Random, o: Outcome) -> float:
    _, o.point = _mid_step(run, rng)

    def running() -> list[str]:
        ids = run.containers()
        return [c for c in ids if _docker("inspect", "-f", "{{.State.Running}}", c) == "true"]

    victim = wait_for(running, 120, "a running sandbox container", alive=run)[0]
    _docker("kill", victim)
    return time.time()


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True).stdout.strip()


def remote_server_down(run: Run, rng: random.Random, down_s: float = 30.0) -> Outcome:
    """The sandbox server the env's tool calls go to is killed, and started again ``down_s``
    later on the same port."""
    o = Outcome(f"remote sandbox server down {down_s:.0f}s", run.mode)
    token = uuid.uuid4().hex
    (run.work / "token").write_text(token)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve = [sys.executable, "-m", "vime", "sandbox", "serve", "--port", str(port),
             "--token-file", str(run.work / "token"), "--backend", "local"]  # fmt: skip

    def start_server() -> subprocess.Popen:
        server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(lambda: _port_open(port), 60, "the sandbox server")
        return server

    server = start_server()
    kwargs = {"sandbox": "remote", "url": f"http://127.0.0.1:{port}", "token": token}
    run.extra_args = ("--env-kwargs", json.dumps(kwargs))
    try:
        run.start()
        _, o.point = _mid_step(run, rng)
        server.kill()
        server.wait()
        at = time.time()
        time.sleep(down_s)
        server = start_server()
        run.wait()
        o.message = _error_line(run.log_text())
        return account(run, o, at)
    finally:
        server.kill()
        server.wait()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _resume(run: Run, o: Outcome, before: int, ckpt: int) -> None:
    o.since_checkpoint = before - ckpt
    t = time.time()
    run.start("--resume")
    code = run.wait()
    o.extra["resume_rc"] = code
    o.steps_lost = _steps_redone(run, before)
    later = [r["time"] for r in run.rows() if r["time"] > t]
    o.recover_s = round(min(later) - t, 1) if later else None


def fault_in_run(name: str, inject: Callable, expect_exit: bool = False) -> Callable:
    """A fault the run must survive in-process (or, with ``expect_exit``, stop cleanly from)."""

    def case(run: Run, rng: random.Random) -> Outcome:
        o = Outcome(name, run.mode)
        run.start()
        at = inject(run, rng, o)
        if not expect_exit:
            if run.wait() != 0:  # so that a failed case's report says why the run stopped
                o.message = _stop_reason(run.log_text())
            return account(run, o, at)
        code = run.wait()
        o.message = _error_line(run.log_text())
        o.extra["first_rc"] = code
        o.extra["stopped_s"] = round(time.time() - at, 1)
        o.extra["leftovers_after_stop"] = run.leftovers()
        _resume(run, o, run.steps_done(), run.checkpoint_step())
        return account(run, o, None)

    return case


def driver_kill_in_checkpoint(run: Run, rng: random.Random) -> Outcome:
    o = Outcome("driver SIGKILL during checkpoint", run.mode)
    ckpts = run.out / "checkpoints"
    run.start()
    target = rng.choice([2, 4]) if run.steps >= 4 else 2

    def writing() -> bool:
        return ckpts.is_dir() and any(
            p.name.startswith(f".tmp_step_{target:06d}") for p in ckpts.iterdir()
        )

    wait_for(writing, 600, f"checkpoint {target} being written", poll=0.005)
    run.kill_driver()
    o.point = f"writing step_{target:06d}"
    o.extra["leftovers_after_kill"] = run.leftovers()
    o.extra["cleared_after_kill_s"] = run.cleared_s
    _resume(run, o, run.steps_done(), run.checkpoint_step())
    return account(run, o, None)


def corrupt_checkpoint(run: Run, rng: random.Random) -> Outcome:
    o = Outcome("newest checkpoint corrupted", run.mode)
    run.steps = 2
    run.start("--save-interval", "1")
    run.wait()
    newest = run.out / "checkpoints" / "step_000002"
    files = sorted(p for p in newest.rglob("*") if p.is_file() and p.stat().st_size > 0)
    victim = rng.choice(files)
    data = bytearray(victim.read_bytes())
    if rng.random() < 0.5:
        data = data[: len(data) // 2]
        o.point = f"truncated {victim.relative_to(newest)}"
    else:
        data[rng.randrange(len(data))] ^= 0xFF
        o.point = f"flipped a byte of {victim.relative_to(newest)}"
    victim.write_bytes(bytes(data))
    run.steps = 4
    _resume(run, o, 2, 1)
    o.message = next((x for x in run.log_text().splitlines() if "unusable" in x), "")
    return account(run, o, None)


def disk_full(run: Run, rng: random.Random) -> Outcome:
    """The output folder is a tmpfs with room for one checkpoint (37 MiB) and part of the
    second; its size is drawn, so the second save runs out of room at a different file."""
    o = Outcome("disk full during checkpoint", run.mode)
    run.out.mkdir(parents=True, exist_ok=True)
    size_mib = rng.randint(42, 70)
    o.extra["tmpfs_mib"] = size_mib
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(run.out)], check=True
    )
    try:
        run.start()
        code = run.wait()
        o.extra["first_rc"] = code
        o.message = _error_line(run.log_text())
        before, ckpt = run.steps_done(), run.checkpoint_step()
        o.point = f"saving step_{before:06d} ({size_mib} MiB tmpfs)"
        o.extra["previous_intact"] = _intact(run.out / "checkpoints" / f"step_{ckpt:06d}")
        subprocess.run(["mount", "-o", "remount,size=400m", str(run.out)], check=True)
        _resume(run, o, before, ckpt)
        return account(run, o, None)
    finally:
        run.leftovers(grace_s=30)
        subprocess.run(["umount", "-l", str(run.out)], check=False)


def _intact(path: Path) -> bool:
    from vime.orchestration.run_state import RunStateError, verify_checkpoint

    try:
        verify_checkpoint(path)
    except RunStateError:
        return False
    return True


def _error_line(log: str) -> str:
    return next((x for x in reversed(log.splitlines()) if x.startswith("vime: error:")), "")


def _stop_reason(log: str) -> str:
    """The run's ``vime: error:`` line, else the end of its log (a traceback or a kill)."""
    return _error_line(log) or "log ends: " + " | ".join(log.strip().splitlines()[-8:])[-1500:]


# Every task carries the fault; the env injects it into a random 30% of the episodes.
POISON = {"env reset raises": "reset", "env step raises": "step", "grader times out": "grader"}

FAULTS: dict[str, Callable[[Run, random.Random], Outcome]] = {
    "engine kill -9": fault_in_run("engine kill -9", _kill_mid_rollout(ENGINE)),
    # vllm-router renames its process "vllm::router". Killed mid-rollout: its death drops
    # every request in flight (CI once saw that fail a whole step).
    "router kill -9": fault_in_run("router kill -9", _kill_mid_rollout(b"vllm::router")),
    "engine SIGSTOP 90s": fault_in_run("engine SIGSTOP 90s", _hang_engine(90.0)),
    "trainer actor killed": fault_in_run(
        "trainer actor killed", _kill_process(b"ray::TrainerWorker"), expect_exit=True
    ),
    "driver SIGKILL during checkpoint": driver_kill_in_checkpoint,
    "newest checkpoint corrupted": corrupt_checkpoint,
    "disk full during checkpoint": disk_full,
    "docker sandbox killed mid-tool-call": fault_in_run(
        "docker sandbox killed mid-tool-call", _kill_container
    ),
    "remote sandbox server down 30s": remote_server_down,
    **{name: fault_in_run(name, _poisoned_tasks) for name in POISON},
}


def run_fault(name: str, work: Path, mode: str = "sync", seed: int = 0) -> Outcome:
    """One run of fault ``name`` in a fresh folder under ``work``."""
    rng = random.Random(seed)
    faults = {}
    if name in POISON:
        faults = dict.fromkeys(range(TASKS), POISON[name])
    folder = work / f"{name.replace(' ', '_')}-{mode}-{seed}"
    shutil.rmtree(folder, ignore_errors=True)  # a rerun starts afresh
    run = Run(folder, mode, faults=faults)
    if name.startswith("docker sandbox"):
        run.extra_args = ("--env-kwargs", json.dumps({"sandbox": "docker"}))
    if name == "trainer actor killed":
        # The kill lands at most a second after step 1, and the driver sees it at its next call
        # to the trainer: with 4 steps of a tiny model on a fast engine the run could be through
        # its last step by then and exit 0 (CI saw this once the CPU engine started faster).
        run.steps = 8
    if name in ("engine kill -9", "router kill -9"):
        # Rollouts long enough, and enough of them, to be caught generating: with 8 tokens an
        # async run's last three steps went by in 1.5 s of 0.2 s rollouts, and CI once saw the
        # harness miss every one ("the run ended before a request ran on the engine").
        run.steps = 6
        run.extra_args = ("--max-tokens", "64")
    try:
        return FAULTS[name](run, rng)
    finally:
        if run.proc is not None and run.proc.poll() is None:
            run.kill_driver()
        run.leftovers(grace_s=5)


COLUMNS = ("modes", "runs finished", "lost silently", "failed with reason", "steps trained twice",
           "steps lost (since ckpt)", "recover s (median)", "left behind")  # fmt: skip


def table(outcomes: list[Outcome]) -> str:
    """The one-table summary, one row per fault (all modes and repeats together)."""
    lines = ["| fault | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name in dict.fromkeys(o.fault for o in outcomes):
        group = [o for o in outcomes if o.fault == name]
        rec = sorted(o.recover_s for o in group if o.recover_s is not None)
        cells = [
            ", ".join(dict.fromkeys(o.mode for o in group)),
            f"{sum(o.finished for o in group)}/{len(group)}",
            str(sum(o.lost_silently for o in group)),
            str(sum(o.failed_with_reason + int(o.extra.get("grader_timeouts", 0)) for o in group)),
            str(sum(o.steps_twice for o in group)),
            f"{max(o.steps_lost for o in group)} ({max(o.since_checkpoint for o in group)})",
            f"{rec[len(rec) // 2]:.0f}" if rec else "-",
            str(sum(o.leftovers + _left_midway(o) for o in group)),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _left_midway(o: Outcome) -> int:
    """Leftovers counted before a resume: after a clean stop, or 20 s after a driver kill."""
    return o.extra.get("leftovers_after_stop", 0) + o.extra.get("leftovers_after_kill", 0)


def busy_engine(minutes: float, concurrency: int = 64, max_tokens: int = 200) -> dict:
    """Keep one engine under full load for ``minutes`` and return what the supervisor did:
    a healthy but busy engine must never be restarted (no ``engine_*`` event)."""
    import asyncio
    import tempfile

    from vime.inference.client import VimeClient
    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService

    model = _tiny_model(Path(tempfile.gettempdir()) / "vime-faults-tiny")
    config = ServeConfig(model=str(model), vllm_args=["--max-model-len", "512", "--enforce-eager"])
    done, failed, worst = 0, 0, 0

    async def load(service: InferenceService) -> None:
        nonlocal done, failed, worst
        client = VimeClient(service.base_url, model=service.model_name, max_retries=0)
        deadline = time.monotonic() + 60 * minutes
        sampling = {"max_tokens": max_tokens, "temperature": 1.0}

        async def worker(i: int) -> None:
            nonlocal done, failed
            while time.monotonic() < deadline:
                try:
                    await client.chat([{"role": "user", "content": f"Count to {i}."}],
                                      sampling=sampling, extra_body={"ignore_eos": True})  # fmt: skip
                    done += 1
                except Exception:
                    failed += 1

        async def watch() -> None:
            nonlocal worst
            while time.monotonic() < deadline:
                worst = max(worst, *(e.failed_checks for e in service.engines))
                await asyncio.sleep(0.5)

        try:
            await asyncio.gather(watch(), *(worker(i) for i in range(concurrency)))
        finally:
            await client.close()

    with InferenceService(config) as service:
        asyncio.run(load(service))
        events = [f"{e.kind}: {e.detail}" for e in service.events]
        restarts = sum(e.restarts for e in service.engines)
    return {"minutes": minutes, "concurrency": concurrency, "requests": done, "failed": failed,
            "worst_failed_health_checks": worst, "restarts": restarts, "events": events}  # fmt: skip


def _run_or_record(name: str, work: Path, mode: str, seed: int) -> Outcome:
    """:func:`run_fault`, with a harness error (a fault missed, a wait timed out) recorded as an
    unfinished run with its reason, so that one bad run does not end the matrix."""
    try:
        return run_fault(name, work, mode, seed)
    except Exception as e:  # any error of the harness is the run's outcome
        return Outcome(
            name, mode, point=f"seed {seed}", message=f"harness: {type(e).__name__}: {e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default="all", help="comma-separated names, or 'all'")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/faults"))
    parser.add_argument(
        "--busy-minutes", type=float, default=0,
        help="instead: one engine under full load this long; it must never be restarted",
    )  # fmt: skip
    args = parser.parse_args()
    if args.busy_minutes:
        print(json.dumps(busy_engine(args.busy_minutes)))
        return
    names = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for name in names:
        for mode in args.modes.split(","):
            for seed in range(args.repeats):
                o = _run_or_record(name, args.out, mode, seed)
                outcomes.append(o)
                print(json.dumps(asdict(o)), flush=True)
                with (args.out / "outcomes.jsonl").open("a") as f:
                    f.write(json.dumps(asdict(o)) + "\n")
    print(table(outcomes))


if __name__ == "__main__":
    main()
