"""Typed configuration of advantages and the policy loss (fields become ``vime train`` flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError

# Paper defaults when --eps-clip / --eps-clip-high are not given (PPO; GSPO's are tiny
# because its ratio is a per-token geometric mean).
DEFAULT_CLIP = {"ppo": (0.2, 0.2), "gspo": (3e-4, 4e-4)}


@dataclass(frozen=True)
class LossConfig:
    """Policy loss: surrogate, clipping, aggregation, KL/entropy terms, off-policy correction."""

    policy_loss: Literal["ppo", "gspo"] = option(
        "ppo", help="surrogate: token-level PPO clip, or GSPO's sequence-level ratio"
    )
    eps_clip: float | None = option(
        None, help="lower clip range eps_low (default 0.2 for ppo, 3e-4 for gspo)"
    )
    eps_clip_high: float | None = option(
        None,
        help="upper clip range eps_high; > eps_clip is DAPO clip-higher, e.g. 0.28 "
        "(default: eps_clip for ppo, 4e-4 for gspo)",
    )
    eps_clip_c: float | None = option(
        None, help="dual-clip constant c > 1 bounding the loss of negative advantages (e.g. 3)"
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = option(
        "token-mean", help="how per-token losses become one scalar"
    )
    kl_loss_coef: float = option(0.0, help="weight of the KL-to-reference loss term (0: off)")
    kl_loss_type: Literal["k1", "k2", "k3"] = option("k3", help="KL estimator of the loss term")
    entropy_coef: float = option(0.0, help="weight of the entropy bonus (0: off)")
    tis_cap: float | None = option(
        None, help="truncated importance sampling cap C on pi_trainer/pi_rollout (None: off)"
    )
    seq_mask_geo_low: float | None = option(
        None, help="drop sequences whose geometric-mean trainer/rollout ratio is below this"
    )
    seq_mask_geo_high: float | None = option(
        None, help="drop sequences whose geometric-mean trainer/rollout ratio is above this"
    )
    seq_mask_token_low: float | None = option(
        None, help="drop sequences with any token trainer/rollout ratio below this"
    )
    seq_mask_token_high: float | None = option(
        None, help="drop sequences with any token trainer/rollout ratio above this"
    )

    def __post_init__(self) -> None:
        low, high = self.clip_low, self.clip_high
        if not 0.0 <= low < 1.0:
            raise ConfigError(f"--eps-clip must be in [0, 1), got {low}")
        if high < 0.0:
            raise ConfigError(f"--eps-clip-high must be >= 0, got {high}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ConfigError(f"--eps-clip-c (dual clip) must be > 1, got {self.eps_clip_c}")
        for name in ("kl_loss_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ConfigError(f"--tis-cap must be > 0, got {self.tis_cap}")
        for lo, hi in (
            ("seq_mask_geo_low", "seq_mask_geo_high"),
            ("seq_mask_token_low", "seq_mask_token_high"),
        ):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a > b:
                raise ConfigError(
                    f"--{lo.replace('_', '-')}={a} is above --{hi.replace('_', '-')}={b}; "
                    "the low bound must not exceed the high bound"
                )

    @property
    def clip_low(self) -> float:
        """The lower clip range eps_low in effect."""
        return DEFAULT_CLIP[self.policy_loss][0] if self.eps_clip is None else self.eps_clip

    @property
    def clip_high(self) -> float:
        """The upper clip range eps_high in effect."""
        if self.eps_clip_high is not None:
            return self.eps_clip_high
        return self.clip_low if self.eps_clip is not None else DEFAULT_CLIP[self.policy_loss][1]

    @property
    def uses_sequence_mask(self) -> bool:
        """Whether any sequence-level mismatch bound is set."""
        return any(
            v is not None
            for v in (
                self.seq_mask_geo_low,
                self.seq_mask_geo_high,
                self.seq_mask_token_low,
                self.seq_mask_token_high,
            )
        )


class _RegisteredEstimators:
    """The names in :data:`vime.algorithms.advantages.ESTIMATORS`, read only when argparse
    checks a value or prints help (so building the flags does not import torch)."""

    def _names(self) -> list[str]:
        from vime.algorithms.advantages import ESTIMATORS

        return list(ESTIMATORS)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


@dataclass(frozen=True)
class AdvantageConfig:
    """Advantage estimator for outcome rewards grouped per prompt."""

    advantage_estimator: str = option(
        "grpo",
        help="how rewards of a group of samples become advantages (docs/algorithms.md)",
        choices=_RegisteredEstimators(),
    )
    advantage_eps: float = option(
        1e-6, help="added to the std before dividing (grpo, reinforce_plus_plus*)"
    )

    def __post_init__(self) -> None:
        from vime.algorithms.advantages import ESTIMATORS

        if self.advantage_estimator not in ESTIMATORS:
            raise ConfigError(
                f"--advantage-estimator {self.advantage_estimator!r} is not registered; "
                f"choose one of {', '.join(ESTIMATORS)}"
            )
        if self.advantage_eps < 0:
            raise ConfigError(f"--advantage-eps must be >= 0, got {self.advantage_eps}")
