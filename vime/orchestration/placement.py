"""The placement plan: which Ray bundles the trainer processes and the vLLM engines get.

Pure data, computed from the config before anything starts, so ``vime train --dry-run`` can
print it and tests can check it. On GPU clusters one bundle is one GPU; on CPU machines a
bundle is a share of the cores, so the same plan runs (slowly) on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vime.errors import ConfigError

Device = Literal["GPU", "CPU"]


@dataclass(frozen=True)
class PlacementConfig:
    """Inputs of the plan (parsed from ``vime train`` flags)."""

    device: Device
    trainer_processes: int = 1
    num_engines: int = 1
    gpus_per_engine: int = 1
    colocate: bool = False
    cpus_per_bundle: float = 1.0
    trainer_resource: str | None = None  # custom Ray resource that pins the trainer's node(s)
    engine_resource: str | None = None  # custom Ray resource that pins the engines' node(s)

    def __post_init__(self) -> None:
        if self.trainer_processes < 1:
            raise ConfigError(f"--trainer-num-processes must be >= 1, got {self.trainer_processes}")
        if self.num_engines < 1:
            raise ConfigError(f"--rollout-num-engines must be >= 1, got {self.num_engines}")
        if self.gpus_per_engine < 1:
            raise ConfigError(
                f"--rollout-num-gpus-per-engine must be >= 1, got {self.gpus_per_engine}"
            )
        if self.colocate and self.num_engines * self.gpus_per_engine != self.trainer_processes:
            raise ConfigError(
                "--colocate shares devices between trainer and engines, so "
                "--rollout-num-engines x --rollout-num-gpus-per-engine "
                f"({self.num_engines} x {self.gpus_per_engine}) must equal "
                f"--trainer-num-processes ({self.trainer_processes})"
            )
        if self.colocate and (self.trainer_resource or self.engine_resource):
            raise ConfigError(
                "--trainer-resource/--engine-resource pin trainer and engines to different "
                "nodes, which contradicts --colocate"
            )


@dataclass(frozen=True)
class Bundle:
    """One Ray placement-group bundle and who uses it."""

    resources: dict[str, float]
    users: tuple[str, ...]


@dataclass(frozen=True)
class PlacementPlan:
    """Placement groups to create (one for colocated, two for disaggregated placement)."""

    groups: dict[str, list[Bundle]] = field(default_factory=dict)
    trainer_group: str = "trainer"
    engine_group: str = "engines"
    # Fraction of a bundle's device each actor asks for (0.5 each when colocated).
    trainer_device_share: float = 1.0
    engine_device_share: float = 1.0

    @property
    def total(self) -> dict[str, float]:
        """Resources the whole plan needs from the cluster."""
        out: dict[str, float] = {}
        for bundles in self.groups.values():
            for b in bundles:
                for k, v in b.resources.items():
                    out[k] = out.get(k, 0.0) + v
        return out

    def describe(self) -> str:
        """A human-readable table of the plan (printed by ``--dry-run``)."""
        lines = []
        for name, bundles in self.groups.items():
            lines.append(f"placement group '{name}' ({len(bundles)} bundles):")
            for i, b in enumerate(bundles):
                res = ", ".join(f"{k}={v:g}" for k, v in sorted(b.resources.items()))
                lines.append(f"  bundle {i}: {{{res}}} <- {', '.join(b.users)}")
        total = ", ".join(f"{k}={v:g}" for k, v in sorted(self.total.items()))
        lines.append(f"cluster resources needed: {total}")
        return "\n".join(lines)


def _bundle(cfg: PlacementConfig, extra: str | None) -> dict[str, float]:
    res: dict[str, float] = {"CPU": cfg.cpus_per_bundle}
    if cfg.device == "GPU":
        res["GPU"] = 1.0
    if extra:
        res[extra] = 1.0
    return res


def plan_placement(cfg: PlacementConfig) -> PlacementPlan:
    """Compute the bundles for trainer processes and engines."""
    engine_users = [
        f"engine {e} (tp rank {r})"
        for e in range(cfg.num_engines)
        for r in range(cfg.gpus_per_engine)
    ]
    if cfg.colocate:
        bundles = [
            Bundle(_bundle(cfg, None), (f"trainer rank {i}", engine_users[i]))
            for i in range(cfg.trainer_processes)
        ]
        return PlacementPlan(
            groups={"colocated": bundles},
            trainer_group="colocated",
            engine_group="colocated",
            trainer_device_share=0.5,
            engine_device_share=0.5,
        )
    trainer = [
        Bundle(_bundle(cfg, cfg.trainer_resource), (f"trainer rank {i}",))
        for i in range(cfg.trainer_processes)
    ]
    engines = [Bundle(_bundle(cfg, cfg.engine_resource), (u,)) for u in engine_users]
    return PlacementPlan(groups={"trainer": trainer, "engines": engines})


def check_fits(plan: PlacementPlan, available: dict[str, float]) -> None:
    """Raise a ConfigError naming the resource when the cluster cannot hold the plan."""
    for key, need in plan.total.items():
        have = available.get(key, 0.0)
        if have + 1e-9 < need:
            raise ConfigError(
                f"the placement needs {key}={need:g} but the Ray cluster has {key}={have:g}; "
                "use fewer engines/trainer processes, --colocate, or a bigger cluster"
            )
