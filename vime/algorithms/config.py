"""Typed configuration of advantages and the policy loss (fields become ``vime train`` flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vime.config.schema import option
from vime.errors import ConfigError

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


@dataclass(frozen=True)
class LossDefinition:
    """What a policy loss's paper fixes: its clip ranges and the aggregation its objective
    is written with. ``aggregations`` are the modes that keep that objective."""

    clip: tuple[float, float]
    aggregation: AggMode
    aggregations: tuple[AggMode, ...]


# PPO's objective is an expectation over tokens and any aggregation is a valid estimator of
# it; GSPO's is a mean over sequences of one sequence-level term (Zheng et al. 2025), and its
# clip ranges are tiny because its ratio is a per-token geometric mean.
POLICY_LOSSES: dict[str, LossDefinition] = {
    "ppo": LossDefinition(
        (0.2, 0.2), "token-mean", ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
    ),
    "gspo": LossDefinition((3e-4, 4e-4), "seq-mean-token-mean", ("seq-mean-token-mean",)),
}


def clip_range(
    policy_loss: str, eps_low: float | None, eps_high: float | None
) -> tuple[float, float]:
    """The ``(eps_low, eps_high)`` in effect; the one rule for every loss and caller.

    Neither given: the loss's paper pair (ppo 0.2/0.2, gspo 3e-4/4e-4). Only ``eps_low``
    given: ``eps_high = eps_low`` (a symmetric clip, never a paper default of another
    scale). Only ``eps_high`` given: the paper's ``eps_low`` with it (e.g. DAPO's 0.2/0.28).
    """
    paper_low, paper_high = POLICY_LOSSES[policy_loss].clip
    if eps_low is None:
        return paper_low, paper_high if eps_high is None else eps_high
    return eps_low, eps_low if eps_high is None else eps_high


def _defaults(index: int) -> str:
    return ", ".join(f"{v.clip[index]:g} for {k}" for k, v in POLICY_LOSSES.items())


@dataclass(frozen=True)
class LossConfig:
    """Policy loss: surrogate, clipping, aggregation, KL/entropy terms, off-policy correction."""

    policy_loss: Literal["ppo", "gspo"] = option(
        "ppo", help="surrogate: token-level PPO clip, or GSPO's sequence-level ratio"
    )
    eps_clip: float | None = option(None, help=f"lower clip range eps_low; unset: {_defaults(0)}")
    eps_clip_high: float | None = option(
        None,
        help="upper clip range eps_high; > eps_clip is DAPO clip-higher, e.g. 0.28; unset: "
        f"--eps-clip when that is given (a symmetric clip), else {_defaults(1)}",
    )
    eps_clip_c: float | None = option(
        None, help="dual-clip constant c > 1 bounding the loss of negative advantages (e.g. 3)"
    )
    loss_agg_mode: AggMode | None = option(
        None,
        help="how per-token losses become one scalar; unset: the loss's own ("
        + ", ".join(f"{v.aggregation} for {k}" for k, v in POLICY_LOSSES.items())
        + ")",
    )
    allow_loss_agg_mismatch: bool = option(
        False,
        help="accept a --loss-agg-mode that contradicts --policy-loss's definition (e.g. gspo "
        "with token-mean); docs/algorithms.md says what such a combination optimises",
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
        definition = POLICY_LOSSES[self.policy_loss]
        if self.loss_agg_mode is None:
            object.__setattr__(self, "loss_agg_mode", definition.aggregation)
        elif self.loss_agg_mode not in definition.aggregations and not (
            self.allow_loss_agg_mismatch
        ):
            raise ConfigError(
                f"--policy-loss {self.policy_loss} is defined with --loss-agg-mode "
                f"{definition.aggregation} (one term per sequence, averaged over sequences); "
                f"--loss-agg-mode {self.loss_agg_mode} optimises a different objective. Leave "
                "--loss-agg-mode unset, or add --allow-loss-agg-mismatch to train with it "
                "anyway (docs/algorithms.md says what it means)"
            )
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
        """The lower clip range eps_low in effect (:func:`clip_range`)."""
        return clip_range(self.policy_loss, self.eps_clip, self.eps_clip_high)[0]

    @property
    def clip_high(self) -> float:
        """The upper clip range eps_high in effect (:func:`clip_range`)."""
        return clip_range(self.policy_loss, self.eps_clip, self.eps_clip_high)[1]

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
