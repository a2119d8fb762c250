"""--share-prompts: samples with the same prompt hold it once in a packed micro-batch.

The reference is the definition: each sample packed whole, attending only within itself. The
shared layout must give every sample the same logprobs, the step the same loss and gradients,
in float32 to rounding, through the path ``vime train`` runs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_data import grouped_batch, sample

from vime.errors import ConfigError
from vime.training.attention import causal_sdpa, packed_causal_sdpa
from vime.training.base import TrainerConfig
from vime.training.packing import (
    MicroBatch,
    pack_inputs,
    plan_micro_batches,
    prompt_units,
    shared_cost,
)


def test_a_group_holds_its_prompt_once_and_each_sample_continues_it():
    p = [5, 6, 7, 8]
    samples = [sample(p, [1, 2]), sample(p, [3]), sample([1, 2], [9, 9, 9]), sample(p, [4, 4, 4])]
    mb = MicroBatch((0, 1, 2, 3), 17)
    x = pack_inputs(samples, mb, loss_rows_only=True, share_prompts=True)
    # The prompt's first 3 tokens once; each sample from the prompt's last token (8) on.
    assert x.input_ids.tolist() == [[5, 6, 7, 8, 1, 2, 8, 3, 8, 4, 4, 4, 1, 2, 9, 9, 9]]
    assert x.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 3, 4, 3, 4, 5, 6, 0, 1, 2, 3, 4]]
    assert x.cu_seqlens == [0, 3, 6, 8, 12, 17]
    assert x.parents == [-1, 0, 0, 0, -1]
    assert x.scored_rows.tolist() == [3, 4, 6, 8, 9, 10, 13, 14, 15]
    values = torch.arange(16.0) + 100  # row t's value
    got = [v.tolist() for v in x.unpack(values)]
    assert got == [
        [0, 100, 101, 102, 103, 104],
        [0, 100, 101, 102, 106],
        [0, 112, 113, 114, 115],
        [0, 100, 101, 102, 108, 109, 110],
    ]
    # Unshared, the same micro-batch is each sample whole, in order.
    plain = pack_inputs(samples, mb, share_prompts=False)
    assert plain.num_tokens == 6 + 5 + 5 + 7 and plain.parents is None
    assert shared_cost(4, [6, 5, 7]) == x.num_tokens - 5


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), min_size=1, max_size=6)),
        min_size=1,
        max_size=10,
    ),
    st.booleans(),
)
def test_every_scored_token_is_the_target_of_its_row(spec, loss_rows_only):
    """Whatever the groups: row r that :meth:`unpack` puts at token j of a sample holds token
    j - 1 at position j - 1, attends to the sample's earlier tokens only (its segment, after
    its parent), and, for a loss token, is followed in the row by token j itself."""
    prompts = [[1], [2, 3], [2, 3, 4, 5], [9, 9, 9]]
    samples = [sample(prompts[k], [10 + t for t in r]) for k, r in spec]
    x = pack_inputs(
        samples,
        MicroBatch(tuple(range(len(samples))), 0),
        loss_rows_only=loss_rows_only,
        share_prompts=True,
    )
    ids, pos = x.input_ids[0].tolist(), x.position_ids[0].tolist()
    segment_of = [i for i in range(len(x.cu_seqlens) - 1) for _ in range(x.cu_seqlens[i + 1] - x.cu_seqlens[i])]  # fmt: skip
    rows = x.unpack(torch.arange(x.num_tokens - 1.0))
    scored = set(x.scored_rows.tolist()) if loss_rows_only else set()
    for s, r in zip(samples, rows, strict=True):
        assert len(r) == s.num_tokens and r[0] == 0
        seen = []
        for j in range(1, s.num_tokens):
            row = int(r[j])
            assert (ids[row], pos[row]) == (s.token_ids[j - 1], j - 1)
            seg = segment_of[row]
            assert seen == [] or segment_of[seen[-1]] in (seg, x.parents[seg])
            seen.append(row)
            if s.loss_mask[j]:
                assert ids[row + 1] == s.token_ids[j] and segment_of[row + 1] == seg
                assert row in scored or not loss_rows_only
    assert sorted(scored) == sorted(
        int(r[j]) for s, r in zip(samples, rows, strict=True) for j in range(1, s.num_tokens) if s.loss_mask[j]
    ) or not loss_rows_only  # fmt: skip
    assert x.num_tokens == sum(c for _, c in prompt_units(samples, 10**6))


def test_a_group_is_planned_into_one_micro_batch_and_split_only_over_the_budget():
    p = list(range(1, 11))  # 10 tokens
    samples = [
        sample(p, [1] * 6),
        sample([50, 51], [1] * 20),
        sample(p, [1] * 4),
        sample(p, [1] * 2),
    ]
    units = prompt_units(samples, 64)
    # The group costs 9 + (7 + 5 + 3) = 24 packed tokens instead of 16 + 14 + 12.
    assert units == [([0, 2, 3], 24), ([1], 22)]
    plan = plan_micro_batches([s.num_tokens for s in samples], 30, 1, units)[0]
    assert [(mb.indices, mb.num_tokens) for mb in plan] == [((0, 2, 3), 24), ((1,), 22)]
    # Over a budget of 20 the group splits, longest first; each part holds the prompt once.
    assert prompt_units(samples, 20)[:2] == [([0], 16), ([2, 3], 9 + 5 + 3)]
    with pytest.raises(ValueError, match="cover samples"):
        plan_micro_batches([4, 4], 8, 1, [([0], 4)])


@pytest.mark.parametrize("heads,groups", [(4, 2), (2, 2)])
def test_attention_over_a_shared_prompt_equals_each_sequence_whole(heads, groups):
    """Forward and gradients (float32): the shared prompt's key/value gradients are the sums
    of what each sample's own copy of the prompt received."""
    gen = torch.Generator().manual_seed(0)
    prompt, suffixes, other = 5, [3, 1, 6], 4  # a suffix starts at the prompt's last token
    shared = prompt - 1
    total = shared + sum(suffixes) + other
    q, k, v = (
        torch.randn(1, total, h, 8, generator=gen, requires_grad=True)
        for h in (heads, groups, groups)
    )
    grad = torch.randn(1, total, heads, 8, generator=gen)
    bounds = [0, shared]
    for n in [*suffixes, other]:
        bounds.append(bounds[-1] + n)
    out = packed_causal_sdpa(q, k, v, bounds, parents=[-1, 0, 0, 0, -1])
    (out * grad).sum().backward()

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    want = torch.zeros_like(out)
    for a, b in list(itertools.pairwise(bounds))[1:-1]:  # each sample whole
        idx = torch.cat([torch.arange(shared), torch.arange(a, b)])
        o = causal_sdpa(*(t[:, idx] for t in leaves))
        want[:, a:b] = o[:, shared:].detach()
        (o[:, shared:] * grad[:, a:b]).sum().backward()
    o = causal_sdpa(*(t[:, :shared] for t in leaves))
    want[:, :shared] = o.detach()
    (o * grad[:, :shared]).sum().backward()
    o = causal_sdpa(*(t[:, bounds[-2] :] for t in leaves))
    want[:, bounds[-2] :] = o.detach()
    (o * grad[:, bounds[-2] :]).sum().backward()
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    for got, ref in zip((q, k, v), leaves, strict=True):
        torch.testing.assert_close(got.grad, ref.grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "parents", [[-1, 1], [0, -1], [-1, 0, 1], [-1]], ids=["forward", "self", "nested", "count"]
)
def test_attention_refuses_parents_it_cannot_follow(parents):
    q = torch.randn(1, 6, 2, 4)
    bounds = [0, 2, 6] if len(parents) != 3 else [0, 2, 4, 6]
    with pytest.raises(ValueError, match="packed parents"):
        packed_causal_sdpa(q, q, q, bounds, parents=parents)


def _trainer(folder, tmp_path, *flags: str):
    """A torch trainer built as ``vime train`` builds it (flags -> setup -> trainer)."""
    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup
    from vime.training.torch_backend import TorchTrainer

    argv = ["train", "--model", str(folder), "--env", "vime/Math-v0", "--output-dir",
            str(tmp_path), "--lr", "1e-3", "--max-tokens-per-micro-batch", "48", *flags]  # fmt: skip
    setup = build_setup(parse_args(argv))
    return TorchTrainer(setup.trainer, setup.loss)


def test_shared_prompts_change_no_logprob_loss_or_weight(untied_qwen3, tmp_path):
    """float32, two steps from the CLI: the default (shared) and --no-share-prompts give the
    same logprobs before and after, the same step logprobs, loss, gradient norm and weights,
    from fewer packed tokens."""
    runs = {}
    for flags in ((), ("--no-share-prompts",)):
        trainer = _trainer(untied_qwen3, tmp_path, *flags)
        batch = grouped_batch(0)
        first = trainer.compute_logprobs(batch)
        steps = [trainer.train_step(grouped_batch(s)) for s in (0, 1)]
        runs[flags] = (trainer.shares_prompts, first, steps, trainer.step_logprobs(), trainer.compute_logprobs(batch), dict(trainer.model.named_parameters()))  # fmt: skip
    shared, whole = runs[()], runs[("--no-share-prompts",)]
    assert shared[0] and not whole[0]
    for a, b in zip(shared[1] + shared[3] + shared[4], whole[1] + whole[3] + whole[4], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=5e-6)
    for a, b in zip(shared[2], whole[2], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert a["num_tokens"] == b["num_tokens"] == b["num_packed_tokens"]
        assert a["num_packed_tokens"] < 0.85 * b["num_packed_tokens"]
    for name, w in whole[5].items():
        torch.testing.assert_close(shared[5][name], w, rtol=0, atol=1e-5)


def test_share_prompts_is_refused_where_it_cannot_apply(tmp_path):
    assert TrainerConfig(hf_checkpoint="m").shares_prompts()
    assert not TrainerConfig(hf_checkpoint="m", share_prompts=False).shares_prompts()
    assert not TrainerConfig(hf_checkpoint="m", backend="megatron").shares_prompts()
    assert not TrainerConfig(hf_checkpoint="m", attn_implementation="sdpa").shares_prompts()
    with pytest.raises(ConfigError, match="--share-prompts needs --backend torch"):
        TrainerConfig(hf_checkpoint="m", backend="megatron", share_prompts=True)
    with pytest.raises(ConfigError, match=r"--attn-implementation packed_sdpa, got .* sdpa"):
        TrainerConfig(hf_checkpoint="m", attn_implementation="sdpa", share_prompts=True)
