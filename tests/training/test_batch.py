"""TrainSample / TrainBatch validation and conversion from trajectories."""

from __future__ import annotations

import pytest

from vime.training.batch import TrainBatch, TrainSample
from vime.types import Trajectory


def sample(**overrides):
    fields = dict(
        token_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        advantages=[0.0, 0.0, 1.5, 1.5],
        rollout_logprobs=[0.0, 0.0, -0.5, -1.25],
        sample_id="t/0",
    )
    fields.update(overrides)
    return TrainSample(**fields)


def test_valid_sample_counts_tokens():
    s = sample()
    assert (s.num_tokens, s.num_loss_tokens) == (4, 2)


@pytest.mark.parametrize("name", ["loss_mask", "advantages", "rollout_logprobs", "old_logprobs"])
def test_length_mismatch_names_the_field(name):
    with pytest.raises(ValueError, match=rf"'t/0': {name} has 3 entries but token_ids has 4"):
        sample(**{name: [0, 0, 0]})


def test_logprob_outside_mask_is_reported_as_misalignment():
    # The engine's logprobs shifted one token left: index 1 (a prompt token) holds a value.
    with pytest.raises(ValueError, match=r"rollout_logprobs\[1\] = -0.5 but loss_mask\[1\] is 0"):
        sample(rollout_logprobs=[0.0, -0.5, -1.25, 0.0])


def test_mask_on_first_token_is_rejected():
    with pytest.raises(ValueError, match=r"loss_mask\[0\] is 1"):
        sample(loss_mask=[1, 0, 1, 1], rollout_logprobs=[-0.1, 0.0, -0.5, -1.25])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(token_ids=[]), "token_ids is empty"),
        (dict(token_ids=[5, -1, 7, 8]), r"token_ids\[1\] = -1"),
        (dict(loss_mask=[0, 0, 2, 1]), r"loss_mask\[2\] = 2, expected 0 or 1"),
        (dict(advantages=[0.0, 0.0, float("nan"), 1.0]), r"advantages\[2\] = nan"),
        (dict(rollout_logprobs=[0.0, 0.0, 0.5, -1.0]), r"rollout_logprobs\[2\] = 0.5 is not"),
        (dict(ref_logprobs=[0.0, 0.0, float("-inf"), -1.0]), r"ref_logprobs\[2\] = -inf"),
    ],
)
def test_bad_values_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        sample(**overrides)


def trajectory():
    return Trajectory(
        token_ids=[1, 2, 3, 4, 5],
        loss_mask=[0, 0, 1, 0, 1],
        logprobs=[0.0, 0.0, -0.3, 0.0, -0.7],
        prompt_length=2,
        task_id="gsm8k-7",
        sample_index=3,
    )


def test_scalar_advantage_is_broadcast_over_sampled_tokens():
    s = TrainSample.from_trajectory(trajectory(), 2.0)
    assert s.advantages == [0.0, 0.0, 2.0, 0.0, 2.0]
    assert s.rollout_logprobs == [0.0, 0.0, -0.3, 0.0, -0.7]
    assert s.sample_id == "gsm8k-7/3"


def test_per_token_advantages_are_zeroed_outside_mask():
    s = TrainSample.from_trajectory(trajectory(), [9.0, 9.0, 1.0, 9.0, 3.0], sample_id="x")
    assert s.advantages == [0.0, 0.0, 1.0, 0.0, 3.0]
    assert s.sample_id == "x"


def test_per_token_advantages_of_wrong_length_are_rejected():
    with pytest.raises(ValueError, match="got 2 advantages for 5 tokens"):
        TrainSample.from_trajectory(trajectory(), [1.0, 2.0])


def test_batch_from_trajectories_counts_tokens():
    batch = TrainBatch.from_trajectories([trajectory(), trajectory()], [1.0, -1.0])
    assert (len(batch), batch.num_tokens, batch.num_loss_tokens) == (2, 10, 4)
    assert batch[1].advantages == [0.0, 0.0, -1.0, 0.0, -1.0]


def test_batch_rejects_non_samples():
    with pytest.raises(TypeError, match=r"samples\[0\] is a dict"):
        TrainBatch([{"token_ids": [1]}])


def test_batch_without_loss_tokens_cannot_be_trained():
    masked = sample(loss_mask=[0, 0, 0, 0], rollout_logprobs=[0.0] * 4)
    with pytest.raises(ValueError, match="none of the 1 samples has a token with loss_mask 1"):
        TrainBatch([masked]).require_loss_tokens()
    with pytest.raises(ValueError, match="the batch has no samples"):
        TrainBatch([]).require_loss_tokens()


def test_set_logprobs_masks_trainer_output_into_the_token_convention():
    batch = TrainBatch([sample()])
    batch.set_logprobs("old_logprobs", [[0.0, -2.0, -0.4, -1.0]])
    assert batch[0].old_logprobs == [0.0, 0.0, -0.4, -1.0]


@pytest.mark.parametrize(
    "field, rows, message",
    [
        ("rollout_logprobs", [[0.0] * 4], "field must be 'old_logprobs' or 'ref_logprobs'"),
        ("ref_logprobs", [], "got 0 logprob rows for 1 samples"),
        ("ref_logprobs", [[0.0, -1.0]], "'t/0': 2 logprobs for 4 tokens"),
        ("ref_logprobs", [[0.0, 0.0, 3.0, -1.0]], r"ref_logprobs\[2\] = 3.0 is not"),
    ],
)
def test_set_logprobs_rejects_bad_rows(field, rows, message):
    with pytest.raises(ValueError, match=message):
        TrainBatch([sample()]).set_logprobs(field, rows)
