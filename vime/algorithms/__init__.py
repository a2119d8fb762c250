"""RL algorithms as pure torch functions: advantages, policy/value losses, KL, off-policy
correction, and the composed :func:`policy_loss` the trainer backends call.

Names load lazily so that importing :class:`LossConfig` (for flags) does not import torch.
"""

from __future__ import annotations

from vime.lazy import lazy_exports

_LAZY = {
    "LossConfig": "vime.algorithms.config",
    "AdvantageConfig": "vime.algorithms.config",
    "compute_advantages": "vime.algorithms.advantages",
    "ESTIMATORS": "vime.algorithms.advantages",
    "get_estimator": "vime.algorithms.advantages",
    "policy_loss": "vime.algorithms.policy",
    "aggregate_loss": "vime.algorithms.losses",
    "count_loss_units": "vime.algorithms.losses",
    "ppo_clip_loss": "vime.algorithms.losses",
    "gspo_loss": "vime.algorithms.losses",
    "value_loss": "vime.algorithms.losses",
    "grpo_advantages": "vime.algorithms.advantages",
    "dr_grpo_advantages": "vime.algorithms.advantages",
    "rloo_advantages": "vime.algorithms.advantages",
    "reinforce_plus_plus_advantages": "vime.algorithms.advantages",
    "reinforce_plus_plus_baseline_advantages": "vime.algorithms.advantages",
    "gae_advantages": "vime.algorithms.advantages",
    "discounted_returns": "vime.algorithms.advantages",
    "whiten": "vime.algorithms.advantages",
    "broadcast_to_tokens": "vime.algorithms.advantages",
    "kl_estimate": "vime.algorithms.kl",
    "kl_penalized_rewards": "vime.algorithms.kl",
    "entropy_from_logits": "vime.algorithms.kl",
    "overlong_penalty": "vime.algorithms.kl",
    "truncated_importance_weights": "vime.algorithms.offpolicy",
    "sequence_keep_mask": "vime.algorithms.offpolicy",
    "mismatch_metrics": "vime.algorithms.offpolicy",
}

__all__ = list(_LAZY)


__getattr__ = lazy_exports(__name__, _LAZY, globals())
