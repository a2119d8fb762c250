"""Micro-batch planning: token budget, first-fit decreasing, rank balance, packed inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vime.training.batch import TrainSample
from vime.training.packing import pack, pack_inputs, plan_micro_batches, split_across_ranks


def test_first_fit_decreasing_fills_bins_in_order():
    # Sorted: 7(i1) 5(i0) 4(i3) 3(i2) 1(i4); budget 8 -> [7,1] [5,3] [4].
    bins = pack([5, 7, 3, 4, 1], max_tokens=8)
    assert [(b.indices, b.num_tokens) for b in bins] == [((1, 4), 8), ((0, 2), 8), ((3,), 4)]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(50, 120))
def test_every_sample_is_packed_once_within_budget(lengths, budget):
    bins = pack(lengths, budget)
    flat = sorted(i for b in bins for i in b.indices)
    assert flat == list(range(len(lengths)))
    for b in bins:
        assert b.num_tokens == sum(lengths[i] for i in b.indices) <= budget


def test_sample_longer_than_budget_is_rejected():
    with pytest.raises(ValueError, match="sample 1 has 9 tokens, more than the micro-batch budget"):
        pack([3, 9], max_tokens=8)


def test_ranks_get_balanced_token_shares():
    # 10->r0, 9->r1, 2->r1 (11), 1->r0 (11), 1->r0 (tie goes to the lower rank).
    assert split_across_ranks([10, 9, 2, 1, 1], 2) == [[0, 3, 4], [1, 2]]


def test_every_rank_gets_the_same_number_of_micro_batches():
    # Rank 0 holds one long sample (one micro-batch); rank 1 needs two, so rank 0 gets a dummy.
    plan = plan_micro_batches([8, 5, 4], max_tokens=8, world_size=2)
    assert [len(mbs) for mbs in plan] == [2, 2]
    assert [mb.dummy for mb in plan[0]] == [False, True]
    assert [mb.indices for mb in plan[1]] == [(1,), (2,)]


def test_more_ranks_than_samples_gives_dummy_only_ranks():
    plan = plan_micro_batches([3], max_tokens=8, world_size=3)
    assert [[mb.dummy for mb in mbs] for mbs in plan] == [[False], [True], [True]]


def test_packed_inputs_restart_positions_per_sequence():
    samples = [
        TrainSample([1, 2, 3], [0, 1, 1], [0.0] * 3, [0.0, -1.0, -1.0]),
        TrainSample([4, 5], [0, 1], [0.0] * 2, [0.0, -1.0]),
    ]
    inputs = pack_inputs(samples, pack([3, 2], 8)[0])
    assert inputs.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert inputs.cu_seqlens == [0, 3, 5]


def test_loss_rows_are_the_rows_that_score_loss_mask_tokens():
    # A multi-turn sample: prompt, response, tool output (masked), response; then a second one.
    samples = [
        TrainSample([1, 2, 3, 4, 5, 6], [0, 1, 1, 0, 1, 0], [0.0] * 6, [0.0, -1, -1, 0, -1, 0]),
        TrainSample([7, 8, 9], [0, 0, 1], [0.0] * 3, [0.0, 0.0, -1.0]),
    ]
    mb = pack([6, 3], 16)[0]
    assert mb.indices == (0, 1)
    inputs = pack_inputs(samples, mb, loss_rows_only=True)
    # Row t scores token t + 1: tokens 1, 2, 4 of the first sample, token 2 of the second (at 6).
    assert inputs.scored_rows.tolist() == [0, 1, 3, 7]
    assert pack_inputs(samples, mb).scored_rows is None
    dummy = plan_micro_batches([6], 16, world_size=2)[1][0]
    assert pack_inputs(samples, dummy, loss_rows_only=True).scored_rows is None
