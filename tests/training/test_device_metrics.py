"""Step metrics folded on the device (one host read per step) equal the per-micro-batch float
path they replaced: every metric of policy_loss read with float() per micro-batch, folded as
Python floats."""

import math

import pytest
import torch

from vime.algorithms import LossConfig
from vime.algorithms.kl import kl_estimate
from vime.algorithms.losses import aggregate_loss, count_loss_units, ppo_clip_loss
from vime.algorithms.offpolicy import (
    _log_ratio,
    sequence_keep_mask,
    truncated_importance_weights,
)
from vime.algorithms.policy import policy_loss_tensors
from vime.training.metrics import MetricSums

D = torch.float32
CONFIG = LossConfig(
    eps_clip=0.2,
    eps_clip_high=0.28,
    eps_clip_c=3.0,
    kl_loss_coef=0.1,
    entropy_coef=0.01,
    tis_cap=1.5,
    seq_mask_geo_low=0.5,
    seq_mask_geo_high=2.0,
    seq_mask_token_high=4.0,
)


def _micro_batches():
    """Four micro-batches: plain, one with a sequence the sequence mask rejects, one whose
    sequences are all rejected (weight 0), and one with an all-masked row."""
    g = torch.Generator().manual_seed(3)
    out = []
    for b, t in ((3, 9), (2, 7), (1, 5), (4, 6)):
        lp = -torch.rand(b, t, generator=g, dtype=D) * 2
        old = lp + torch.randn(b, t, generator=g, dtype=D) * 0.3
        rollout = old + torch.randn(b, t, generator=g, dtype=D) * 0.1
        ref = lp + torch.randn(b, t, generator=g, dtype=D) * 0.2
        entropy = torch.rand(b, t, generator=g, dtype=D)
        adv = torch.randn(b, 1, generator=g, dtype=D).expand(b, t).clone()
        mask = (torch.rand(b, t, generator=g) > 0.2).float()
        mask[:, 0] = 1
        out.append([lp, old, adv, mask, rollout, ref, entropy])
    out[1][4][0] = out[1][1][0] + 3.0  # geometric ratio exp(-3): sequence 0 rejected
    out[2][4][0] = out[2][1][0] - 3.0  # the only sequence rejected: no loss token left
    out[3][3][2] = 0.0  # a row without loss tokens
    return out


def _float_path(lp, old, adv, mask, rollout, ref, entropy, num_tokens, num_seqs):
    """The metrics as the trainer computed them before: a float() per value, boolean indexing,
    Python arithmetic."""
    metrics = {}
    active = mask.bool()
    count = int(active.sum())
    if count:
        abs_diff = (old - rollout).double()[active].abs()
        log_r = _log_ratio(old, rollout, mask).double()[active]
        metrics["mismatch/abs_diff_mean"] = float(abs_diff.mean())
        metrics["mismatch/abs_diff_max"] = float(abs_diff.max())
        metrics["mismatch/kl_k3"] = float((torch.expm1(log_r) - log_r).mean())
        metrics["mismatch/kl_k1"] = float((-log_r).mean())
    keep = sequence_keep_mask(
        old, rollout, mask, geo_low=0.5, geo_high=2.0, token_low=None, token_high=4.0
    )
    metrics["policy/seq_masked_frac"] = float((~keep).sum()) / max(count_loss_units(mask)[1], 1)
    loss_mask = mask * keep[:, None].to(mask.dtype)
    out = ppo_clip_loss(lp, old, adv, loss_mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    weights = truncated_importance_weights(old, rollout, loss_mask, cap=1.5)
    per_token = out.loss * weights
    kl = kl_estimate(lp, ref, loss_mask, CONFIG.kl_loss_type)
    total = per_token + 0.1 * kl - 0.01 * entropy * loss_mask
    loss = aggregate_loss(total, loss_mask, num_tokens=num_tokens, num_seqs=num_seqs)
    active = loss_mask.bool()
    count = int(active.sum())
    lm = loss_mask.double()

    def mean(values):
        return float((values.double() * lm).sum() / count) if count else 0.0

    log_ratio = torch.log(out.ratio.double())
    metrics.update(
        {
            "policy/loss": float(loss),
            "policy/pg_loss": mean(per_token),
            "policy/clipfrac_low": float(out.clipped_low.sum()) / max(count, 1),
            "policy/clipfrac_high": float(out.clipped_high.sum()) / max(count, 1),
            "policy/clipfrac_dual": float(out.clipped_dual.sum()) / max(count, 1),
            "policy/approx_kl": mean(torch.expm1(log_ratio) - log_ratio),
            "policy/ratio_mean": mean(out.ratio),
            "policy/ratio_max": float(out.ratio[active].max()) if count else 0.0,
            "policy/num_tokens": float(count),
            "policy/kl_loss": mean(kl),
            "policy/entropy": mean(entropy),
            "policy/tis_weight_mean": mean(weights),
            "policy/tis_clipfrac": float(((weights >= 1.5) & active).sum()) / max(count, 1),
        }
    )
    return loss, metrics


def _fold_floats(per_mb):
    """The old MetricSums arithmetic on Python floats."""
    weighted, weights, sums, maxima = {}, {}, {}, {}
    for metrics in per_mb:
        w = metrics["policy/num_tokens"]
        for k, v in metrics.items():
            if k.endswith("_max"):
                maxima[k] = max(maxima.get(k, -math.inf), v)
            elif k.endswith("num_tokens"):
                sums[k] = sums.get(k, 0.0) + v
            elif w > 0:
                weighted[k] = weighted.get(k, 0.0) + v * w
                weights[k] = weights.get(k, 0.0) + w
    return {**{k: weighted[k] / weights[k] for k in weighted}, **sums, **maxima}


def test_device_metrics_equal_the_per_micro_batch_float_path():
    mbs = _micro_batches()
    num_tokens = sum(count_loss_units(mb[3])[0] for mb in mbs)
    num_seqs = sum(count_loss_units(mb[3])[1] for mb in mbs)
    sums, reference = MetricSums(), []
    for lp, old, adv, mask, rollout, ref, entropy in mbs:
        loss, metrics = policy_loss_tensors(
            lp,
            old,
            adv,
            mask,
            CONFIG,
            rollout_logprobs=rollout,
            ref_logprobs=ref,
            entropy=entropy,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
        ref_loss, ref_metrics = _float_path(
            lp, old, adv, mask, rollout, ref, entropy, num_tokens, num_seqs
        )
        assert loss.item() == ref_loss.item()
        metrics.pop("policy/loss"), ref_metrics.pop("policy/loss")
        sums.add(metrics, weight=metrics["policy/num_tokens"])
        reference.append(ref_metrics)
    assert reference[2]["policy/num_tokens"] == 0.0  # the weight-0 case is exercised
    assert reference[1]["policy/seq_masked_frac"] == 0.5
    got, want = sums.reduce(), _fold_floats(reference)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if key.startswith("mismatch/") and not key.endswith("_max"):
            # A masked sum instead of a mean over the selected entries: float64 summation
            # order differs, nothing else.
            assert got[key] == pytest.approx(value, rel=1e-13, abs=0), key
        else:
            assert got[key] == value, key


def test_metric_sums_keep_the_float_semantics():
    sums = MetricSums()
    sums.add({"a": 2.0, "x_max": 1.0, "n/num_tokens": 3.0}, weight=3.0)
    sums.add({"a": torch.tensor(5.0, dtype=torch.float64), "x_max": torch.tensor(4.0)}, 1.0)
    sums.add({"a": torch.tensor(100.0, dtype=torch.float64), "b": 7.0}, weight=0.0)
    sums.add({"c": torch.tensor(1.0, dtype=torch.float64)}, torch.tensor(0.0))  # no weight: absent
    assert sums.reduce() == {"a": (2.0 * 3.0 + 5.0) / 4.0, "x_max": 4.0, "n/num_tokens": 3.0}


def test_metric_sums_fold_varying_keys_like_the_float_path():
    """Micro-batches with different keys, weights of 0, floats before tensors: the same float64
    values, bit for bit, as the float path (a key a micro-batch lacks adds nothing)."""
    g = torch.Generator().manual_seed(5)
    per_mb = []
    for keys, w in ((("a", "b"), 3.0), (("b", "c"), 0.0), (("a", "c", "d"), 7.0), (("d",), 2.0)):
        values = {k: float(torch.rand((), generator=g, dtype=torch.float64)) for k in keys}
        per_mb.append({**values, "policy/num_tokens": w})
    sums = MetricSums()
    for i, metrics in enumerate(per_mb):
        w = metrics["policy/num_tokens"]
        if i == 0:  # the first micro-batch as floats, the rest as tensors
            sums.add(metrics, weight=w)
        else:
            tensors = {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}
            sums.add(tensors, weight=tensors["policy/num_tokens"])
    assert sums.reduce() == _fold_floats(per_mb)


def test_metric_sums_fold_a_micro_batch_in_a_few_device_ops():
    """However many keys a micro-batch has, its means fold in with the same few device
    operations (each a kernel launch on a GPU), not several per key."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += func.overloadpacket.__name__ != "view"  # views launch nothing
            return func(*args, **(kwargs or {}))

    counts = {}
    for n in (3, 30):
        sums = MetricSums()
        metrics = {f"m{i}": torch.tensor(float(i), dtype=torch.float64) for i in range(n)}
        weight = torch.tensor(4.0, dtype=torch.float64)
        sums.add(metrics, weight)  # the first creates the vectors
        Count.ops = 0
        with Count():
            sums.add(metrics, weight)
        counts[n] = Count.ops
        assert sums.reduce() == {f"m{i}": float(i) for i in range(n)}
    assert counts[3] == counts[30] == 7, counts  # gt, stack, mul, where, add, where, add
