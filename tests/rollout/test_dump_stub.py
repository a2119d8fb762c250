"""JSONL dumps: one line per trajectory with aligned token lists, readable back."""

from __future__ import annotations

import json

import pytest

from vime.rollout import read_jsonl, write_jsonl

SAMPLING = {"max_tokens": 100}


async def test_dump_lines_hold_aligned_token_lists(make_manager, tmp_path):
    batch = await make_manager(n=2).generate([{"id": "0"}, {"id": "1"}], SAMPLING)
    path = tmp_path / "rollout.jsonl"
    assert write_jsonl(batch.trajectories, path) == 4

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 4
    for line in lines:
        n = len(line["token_ids"])
        assert len(line["loss_mask"]) == n and len(line["logprobs"]) == n
        assert all(
            lp == 0.0 for lp, m in zip(line["logprobs"], line["loss_mask"], strict=True) if m == 0
        )
        assert line["loss_mask"][: line["prompt_length"]] == [0] * line["prompt_length"]
        assert line["status"] == "completed"
        assert line["reward"] == 2.0
        assert line["weight_versions"] == [0, 0, 0]
        assert [m["role"] for m in line["messages"]] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]


async def test_dump_reads_back_into_equal_trajectories(make_manager, tmp_path):
    batch = await make_manager(n=1).generate([{"id": "0"}], SAMPLING)
    path = tmp_path / "rollout.jsonl"
    write_jsonl(batch.trajectories, path)

    (back,) = list(read_jsonl(path))
    (original,) = batch.trajectories
    assert back.token_ids == original.token_ids
    assert back.loss_mask == original.loss_mask
    assert back.logprobs == original.logprobs
    assert back.status == original.status


def test_reading_a_bad_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"token_ids": [1], "loss_mask": [], "logprobs": [], "prompt_length": 0}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a trajectory line"):
        list(read_jsonl(path))
