"""Start or join a Ray cluster, and create the placement groups of a plan.

Ray 2.60 turns token authentication on by default, which makes a local cluster unusable
without a token; Vime's own local cluster turns it off (``RAY_AUTH_MODE=disabled``) unless
the user set the variable.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.orchestration.placement import PlacementPlan, check_fits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayConfig:
    """Where Ray runs: a local cluster Vime starts (default) or an existing one."""

    address: str | None = None  # "auto" or "host:port" of a running cluster
    num_cpus: int | None = None  # local cluster only; default: all cores
    resources: dict[str, float] | None = None  # extra custom resources of the local node
    ready_timeout_s: float = 120.0


@contextlib.contextmanager
def ray_cluster(cfg: RayConfig) -> Iterator[dict[str, float]]:
    """Connect to (or start) Ray and yield the cluster's resources; shut down on exit."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        yield dict(ray.cluster_resources())
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if cfg.address:
        kwargs["address"] = cfg.address
    else:
        kwargs["num_cpus"] = cfg.num_cpus or os.cpu_count()
        if cfg.resources:
            kwargs["resources"] = dict(cfg.resources)
    with _run_tag(enabled=not cfg.address) as tag:
        try:
            _init_with_retries(ray, kwargs)
        except ConnectionError as exc:
            raise ConfigError(
                f"--ray-address {cfg.address}: cannot connect to Ray: {exc}"
            ) from None
        if not cfg.address:
            from vime.orchestration.reaper import spawn_reaper

            spawn_reaper(os.getpid(), Path(_session_dir()).name, tag)
        try:
            yield dict(ray.cluster_resources())
        finally:
            ray.shutdown()


@contextlib.contextmanager
def _run_tag(enabled: bool) -> Iterator[str | None]:
    """Tag the processes a local cluster's run starts (the reaper finds them by it) while
    the cluster lives; set before Ray starts, so that its processes inherit it too."""
    if not enabled:
        yield None
        return
    from vime.orchestration.reaper import TAG_VAR, tag_run

    previous = os.environ.get(TAG_VAR)
    try:
        yield tag_run()
    finally:
        if previous is None:
            os.environ.pop(TAG_VAR, None)
        else:
            os.environ[TAG_VAR] = previous


def create_placement_groups(plan: PlacementPlan, timeout_s: float = 120.0) -> dict[str, Any]:
    """Create one Ray placement group per plan group and wait until all are placed."""
    import ray
    from ray.util.placement_group import placement_group

    check_fits(plan, dict(ray.available_resources()))
    groups = {}
    for name, bundles in plan.groups.items():
        pg = placement_group([dict(b.resources) for b in bundles], strategy="PACK", name=name)
        groups[name] = pg
    for name, pg in groups.items():
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            raise ConfigError(
                f"Ray could not place group '{name}' within {timeout_s:.0f} s: "
                f"needs {plan.total}, cluster has {ray.available_resources()}"
            )
    return groups


def _session_dir() -> str:
    """The local Ray session's folder (its name tags every process of the session)."""
    from ray._private import worker

    return worker._global_node.get_session_dir_path()


def _init_with_retries(ray: Any, kwargs: dict[str, Any], attempts: int = 3) -> None:
    """``ray.init``, retried: on a loaded machine a local raylet can miss Ray's fixed 30 s
    registration window ("The current node timed out during startup")."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            log.warning("Ray did not start in time (attempt %d of %d); retrying", attempt, attempts)
            ray.shutdown()
