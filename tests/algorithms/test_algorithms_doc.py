"""docs/algorithms.md's worked examples are the numbers vime computes (the doc cannot drift)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from vime.algorithms.advantages import ESTIMATORS
from vime.algorithms.config import LossConfig
from vime.algorithms.policy import policy_loss
from vime.orchestration.batching import prepare_batch
from vime.types import Trajectory

DOC = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()


def _row(first_cell: str) -> str:
    (line,) = [ln for ln in DOC.splitlines() if ln.startswith(f"| {first_cell} |")]
    return line


def _lists(text: str) -> list[list[float]]:
    return [ast.literal_eval(m) for m in re.findall(r"`(\[[-0-9., ]+\])`", text)]


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_estimator_is_documented_with_its_worked_example(name: str) -> None:
    from vime.algorithms.config import AdvantageConfig

    assert f"| `{name}`" in DOC.split("### Worked example")[0]  # in the formula table
    rows = [ln for ln in DOC.split("### Worked example")[1].splitlines() if f"| `{name}` |" in ln]
    documented = [a for lst in _lists(rows[0]) for a in lst]
    assert len(documented) == 7, rows
    groups = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]]
    episodes = [
        [
            Trajectory(
                token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0, -1], prompt_length=1, reward=r
            )
            for r in group
        ]
        for group in groups
    ]
    out = prepare_batch(episodes, AdvantageConfig(advantage_estimator=name))
    assert out.advantages == pytest.approx(documented, abs=1e-4)


@pytest.mark.parametrize(
    "cell,mode",
    [
        ("`seq-mean-token-mean` (GSPO's)", "seq-mean-token-mean"),
        ("`token-mean`", "token-mean"),
        ("`seq-mean-token-sum`", "seq-mean-token-sum"),
    ],
)
def test_the_gspo_aggregation_table_is_what_policy_loss_computes(cell: str, mode: str) -> None:
    line = _row(cell)
    loss_text = line.split("|")[2]
    documented_loss = float(re.findall(r"= (-?[0-9.]+)`", loss_text)[0])
    (documented_grads,) = _lists(line.split("|")[3])
    mask = torch.zeros(2, 8, dtype=torch.float64)
    mask[0], mask[1, :2] = 1, 1
    adv = torch.tensor([[1.0] * 8, [-1.0] * 8], dtype=torch.float64) * mask
    lp = -mask
    x = lp.clone().requires_grad_(True)
    config = LossConfig(policy_loss="gspo", loss_agg_mode=mode, allow_loss_agg_mismatch=True)
    loss, _ = policy_loss(x, lp.clone(), adv, mask, config)
    loss.backward()
    assert loss.item() == pytest.approx(documented_loss, abs=1e-12)
    assert x.grad.sum(dim=1).tolist() == pytest.approx(documented_grads)
