"""FSDP2 over gloo: two processes train exactly like one on the same data."""

from __future__ import annotations

import pytest
import torch
from trainer_data import config, fail_on_rank_one, train_and_report

from vime.training.launch import spawn
from vime.training.torch_backend import TorchTrainer


@pytest.mark.slow
def test_two_fsdp_processes_match_one_process(untied_qwen3, tmp_path):
    single = train_and_report(untied_qwen3, steps=2)
    ranks = spawn(train_and_report, 2, untied_qwen3, 2, tmp_path / "ck", timeout=500)

    assert ranks[1]["weights"] == {}  # only rank 0 receives exported tensors
    for lp_pair in zip(single["logprobs"], *(r["logprobs"] for r in ranks), strict=True):
        for other in lp_pair[1:]:
            torch.testing.assert_close(other, lp_pair[0], atol=1e-5, rtol=0)
    for m1, m2 in zip(single["metrics"], ranks[0]["metrics"], strict=True):
        assert m2["loss"] == pytest.approx(m1["loss"], abs=1e-5)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        assert m2["num_loss_tokens"] == m1["num_loss_tokens"]
        assert m2["num_packed_tokens"] == m1["num_packed_tokens"]
        assert m2["policy/entropy"] == pytest.approx(m1["policy/entropy"], abs=1e-5)
    shared = single["metrics"][1]  # a grouped batch: shared prompts were packed once
    assert shared["num_packed_tokens"] < 0.85 * shared["num_tokens"]
    assert sorted(ranks[0]["weights"]) == sorted(single["weights"])
    for name, tensor in single["weights"].items():
        torch.testing.assert_close(ranks[0]["weights"][name], tensor, atol=1e-5, rtol=0, msg=name)

    # The 2-process checkpoint holds full tensors: one process resumes from it.
    resumed = TorchTrainer(config(untied_qwen3))
    resumed.load(tmp_path / "ck")
    assert resumed.weight_version == 2
    for name, p in resumed.model.named_parameters():
        torch.testing.assert_close(p.detach(), ranks[0]["weights"][name], atol=0, rtol=0)


@pytest.mark.slow
def test_spawn_reports_the_failing_rank():
    with pytest.raises(RuntimeError, match=r"rank 1 of fail_on_rank_one failed:(.|\n)*boom"):
        spawn(fail_on_rank_one, 2, timeout=120)
