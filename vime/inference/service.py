"""``InferenceService``: N vLLM engines and a vllm-router, kept alive until stopped.

It starts the engines in parallel, waits for their health, tags them with weight version 0,
starts the router with them as workers and then supervises: a dead engine is taken out of
the router, restarted, given the latest weights and version, and re-added; a dead router is
restarted with the healthy engines. ``vime serve``, ``vime train`` and ``vime eval`` use it.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from vime.inference import router as router_mod
from vime.inference.config import ServeConfig
from vime.inference.engines import engine_argv, engine_env, served_model_name
from vime.inference.errors import InferenceError
from vime.inference.processes import ManagedProcess, free_port, http_ok, port_free
from vime.inference.weights import UpdateReport, WeightUpdater

log = logging.getLogger(__name__)

# An engine whose process lives but whose /health fails this many checks in a row is hung.
# A CPU engine saturated by generation can answer /health slowly for a while; restarting it
# then loses its requests for nothing, so the bar is minutes, not seconds.
UNHEALTHY_CHECKS = 30
HEALTH_TIMEOUT_S = 10.0
# An engine that keeps dying is left out after this many restarts (its log says why).
MAX_RESTARTS = 5
# How long a failed weight update waits to see whether an engine died under it.
DEATH_SETTLE_S = 3.0
# How long a restarted router waits for its old port to be released.
ROUTER_PORT_WAIT_S = 30.0


@dataclass
class Engine:
    """One engine process and what Vime knows about it."""

    index: int
    url: str
    process: ManagedProcess
    healthy: bool = False
    restarts: int = 0
    failed_checks: int = 0
    given_up: bool = False


@dataclass
class ServiceEvent:
    """Something the supervisor noticed or did (for logs, metrics and tests)."""

    time: float
    kind: str  # engine_died|_given_up|_restarted|_restart_failed, router_died|_restarted|_restart_failed
    detail: str


@dataclass
class _State:
    weights_folder: str | None = None
    version: int = 0
    events: list[ServiceEvent] = field(default_factory=list)


class InferenceService:
    """vLLM engines behind vllm-router; use as a context manager or call start/stop."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="vime-serve-"))
        self.engines: list[Engine] = []
        self.router: ManagedProcess | None = None
        self.router_port = config.vllm_router_port
        self._state = _State()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._supervisor: threading.Thread | None = None
        self._restarting: set[int] = set()
        # Held across a whole update and across bringing a restarted engine up to date, so
        # an engine that comes back mid-update cannot miss the new weights.
        self._weights_lock = threading.Lock()

    # -- addresses ---------------------------------------------------------------------
    @property
    def router_url(self) -> str:
        """``http://ip:port`` of the router."""
        return f"http://{self.config.vllm_router_ip}:{self.router_port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``) of the router."""
        return f"{self.router_url}/v1"

    @property
    def engine_urls(self) -> list[str]:
        """``http://host:port`` of every engine, healthy or not."""
        return [e.url for e in self.engines]

    @property
    def model_name(self) -> str:
        """The model name to put in requests."""
        return served_model_name(self.config.model)

    @property
    def weight_version(self) -> int:
        """The version of the weights the engines serve (0 = the model folder)."""
        return self._state.version

    @property
    def events(self) -> list[ServiceEvent]:
        """What the supervisor noticed and did, oldest first."""
        with self._lock:
            return list(self._state.events)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> InferenceService:
        """Start engines and router; return once the router answers. Idempotent."""
        if self.engines:  # `with service.start():` enters after start(): start only once
            return self
        cfg = self.config
        for i in range(cfg.rollout_num_engines):
            port = free_port(cfg.engine_host)
            proc = ManagedProcess(
                f"engine {i} (port {port})",
                engine_argv(cfg, port),
                log_path=self.log_dir / f"engine-{i}.log",
                env=engine_env(cfg, i),
            )
            self.engines.append(Engine(i, f"http://{cfg.engine_host}:{port}", proc))
        try:
            for engine in self.engines:
                engine.process.start()
            with ThreadPoolExecutor(len(self.engines)) as pool:
                list(pool.map(self._wait_engine_ready, self.engines))
            if self.router_port == 0:
                self.router_port = free_port(cfg.vllm_router_ip)
            self._start_router()
        except BaseException:
            self.stop()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="vime-supervisor")
        self._supervisor.daemon = True
        self._supervisor.start()
        return self

    def stop(self) -> None:
        """Stop the supervisor, the router and every engine (no process is left behind)."""
        self._stop.set()
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=10)
        procs = [e.process for e in self.engines] + ([self.router] if self.router else [])
        with ThreadPoolExecutor(max(1, len(procs))) as pool:
            list(pool.map(lambda p: p.stop(grace=10.0), procs))

    def __enter__(self) -> InferenceService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- weights -----------------------------------------------------------------------
    def update_weights(self, folder: str | Path, version: int | None = None) -> UpdateReport:
        """Load the safetensors in ``folder`` into every engine; return timings.

        The folder must stay until the next update: a restarted engine reloads it.
        Blocking; from async code use :meth:`aupdate_weights`.
        """
        import asyncio

        with self._weights_lock:
            version = self._state.version + 1 if version is None else version
            updater = WeightUpdater(mode=self.config.weight_update_mode)
            urls = self._live_urls()
            try:
                report = asyncio.run(updater.update(urls, str(folder), version)) if urls else None
            except InferenceError:
                # An engine that died before the supervisor noticed fails the update; the
                # live ones are updated again, the dead one gets these weights on its restart.
                # (Its connection can drop a moment before its process is seen to exit.)
                deadline = time.monotonic() + DEATH_SETTLE_S
                while self._live_urls() == urls and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self._live_urls() == urls:
                    raise
                urls = self._live_urls()
                report = asyncio.run(updater.update(urls, str(folder), version)) if urls else None
            with self._lock:
                self._state.weights_folder = str(folder)
                self._state.version = version
        if report is None:
            # No live engine: each restarts and loads this folder before it takes traffic.
            self._wait_for_an_engine()
            report = UpdateReport(version=version, engines=[])
        return report

    def _wait_for_an_engine(self) -> None:
        deadline = time.monotonic() + self.config.engine_start_timeout
        while not self._live_urls():
            if all(e.given_up for e in self.engines) or time.monotonic() > deadline:
                raise InferenceError(
                    "weight update: no engine is running and none came back from a restart "
                    f"within {self.config.engine_start_timeout:g}s; see the engine logs in "
                    f"{self.log_dir}"
                )
            time.sleep(0.5)

    def _live_urls(self) -> list[str]:
        with self._lock:
            return [e.url for e in self.engines if e.healthy and e.process.alive()]

    async def aupdate_weights(self, folder: str | Path, version: int | None = None) -> UpdateReport:
        """:meth:`update_weights` without blocking the event loop."""
        import asyncio

        return await asyncio.to_thread(self.update_weights, folder, version)

    # -- internals ---------------------------------------------------------------------
    def _wait_engine_ready(self, engine: Engine) -> None:
        engine.process.wait_until(
            lambda: http_ok(f"{engine.url}/health"),
            timeout=self.config.engine_start_timeout,
            what="healthy",
        )
        engine.failed_checks = 0
        self._bring_up_to_date(engine)

    def _bring_up_to_date(self, engine: Engine) -> None:
        """Give a fresh engine the current weights and version (before it takes traffic)."""
        import asyncio

        with self._weights_lock:
            folder, version = self._state.weights_folder, self._state.version
            updater = WeightUpdater(mode="abort")
            if folder is not None:
                if not Path(folder).is_dir():
                    raise InferenceError(
                        f"cannot restore weights v{version} on {engine.url}: {folder} is gone; "
                        f"keep the last update's folder until the next update"
                    )
                asyncio.run(updater.update([engine.url], folder, version))
            else:
                asyncio.run(updater.set_version([engine.url], version))
            engine.healthy = True

    def _start_router(self) -> None:
        cfg = self.config
        workers = [e.url for e in self.engines if e.healthy]
        argv = router_mod.router_argv(
            cfg.vllm_router_ip, self.router_port, workers, cfg.router_args
        )
        if self.router is None:
            self.router = ManagedProcess(
                f"vllm-router (port {self.router_port})",
                argv,
                log_path=self.log_dir / "router.log",
            )
        else:
            self.router.argv = argv
        self.router.start()
        self.router.wait_until(
            lambda: http_ok(f"{self.router_url}/health"), timeout=120, what="healthy"
        )

    def _event(self, kind: str, detail: str) -> None:
        log.warning("vime serve: %s: %s", kind, detail)
        with self._lock:
            self._state.events.append(ServiceEvent(time.time(), kind, detail))

    def _supervise(self) -> None:
        while not self._stop.wait(self.config.health_interval):
            try:
                self._check_router()
                for engine in self.engines:
                    self._check_engine(engine)
            except Exception as exc:  # the supervisor must outlive any single failure
                log.exception("vime serve: supervisor error: %s", exc)

    def _check_router(self) -> None:
        if self.router is None or self.router.alive() or self._stop.is_set():
            return
        self._event("router_died", f"exit code {self.router.returncode()}")
        # Reap anything of the old router still holding its port, then wait for the port:
        # the restart must reuse the address every client already has.
        self.router.stop(grace=2.0)
        deadline = time.monotonic() + ROUTER_PORT_WAIT_S
        while not port_free(self.config.vllm_router_ip, self.router_port):
            if time.monotonic() > deadline:
                self._event("router_restart_failed", f"port {self.router_port} stays in use")
                return
            time.sleep(0.5)
        self._start_router()
        self._event("router_restarted", self.router_url)

    def _check_engine(self, engine: Engine) -> None:
        if engine.index in self._restarting or engine.given_up or self._stop.is_set():
            return
        if engine.process.alive():
            if http_ok(f"{engine.url}/health", timeout=HEALTH_TIMEOUT_S):
                engine.failed_checks = 0
                return
            engine.failed_checks += 1
            if engine.failed_checks < UNHEALTHY_CHECKS:
                return
            reason = f"{engine.url} failed {engine.failed_checks} health checks"
        else:
            reason = f"{engine.url} exited with code {engine.process.returncode()}"
        engine.healthy = False
        self._event("engine_died", reason)
        with contextlib.suppress(httpx.HTTPError):
            router_mod.remove_worker(self.router_url, engine.url)
        if not self.config.restart_dead_engines or engine.restarts >= MAX_RESTARTS:
            engine.given_up = True
            engine.process.stop(grace=5.0)
            self._event("engine_given_up", f"{engine.url}; see {engine.process.log_path}")
            return
        self._restarting.add(engine.index)
        # The process is started from this long-lived thread on purpose: its parent-death
        # signal fires when the spawning *thread* ends, so a short-lived thread would kill it.
        engine.process.stop(grace=5.0)  # reap what is left of the old process group
        engine.restarts += 1
        engine.process.start()
        threading.Thread(
            target=self._readmit_engine, args=(engine,), name=f"vime-readmit-{engine.index}"
        ).start()

    def _readmit_engine(self, engine: Engine) -> None:
        try:
            self._wait_engine_ready(engine)
            router_mod.add_worker(self.router_url, engine.url)
            self._event("engine_restarted", f"{engine.url} (restart {engine.restarts})")
        except Exception as exc:
            if not self._stop.is_set():
                self._event("engine_restart_failed", f"{engine.url}: {exc}")
        finally:
            self._restarting.discard(engine.index)
