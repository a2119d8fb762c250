"""A synthetic ``vime train`` output dir for the viewer's tests and screenshots: metrics.jsonl,
per-step trajectory dumps in the real dump format (``vime.rollout.write_jsonl``), config.json
and a small word-level tokenizer whose pieces include HTML and script text.

    python tests/view/synth_run.py OUT_DIR [--steps S] [--groups G] [--n N]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from vime.rollout.dump import write_jsonl
from vime.types import Status, Trajectory

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
WORDS = [
    "the",
    "answer",
    "is",
    "let",
    "me",
    "compute",
    "so",
    "we",
    "get",
    "=",
    "+",
    "*",
    "\n",
    "<tool_call>",
    "</tool_call>",
    "{",
    "}",
    "calc",
    "result",
    "<b>",
    "</b>",
    "<script>",
    "</script>",
    "&amp;",
    '"',
    "'",
    "x",
    "y",
    "step",
    "check",
] + [str(d) for d in range(100)]


def write_tokenizer(folder: Path) -> Path:
    """A word-level ``tokenizer.json`` over ``WORDS`` (id = position)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {w: i for i, w in enumerate(WORDS)}
    folder.mkdir(parents=True, exist_ok=True)
    Tokenizer(WordLevel(vocab, unk_token="the")).save(str(folder / "tokenizer.json"))
    return folder


def episode(rng: random.Random, step: int, task: int, sample: int, *, trainer: bool) -> Trajectory:
    """One two-turn tool-calling episode with sampled and env tokens, rewards and versions."""
    prompt = [rng.randrange(len(WORDS)) for _ in range(rng.randint(40, 70))]
    ids, mask, lps, versions = (
        list(prompt),
        [0] * len(prompt),
        [0.0] * len(prompt),
        [-1] * len(prompt),
    )
    version = step - 1
    turn_versions = []
    for turn in range(2):
        sampled = [rng.randrange(len(WORDS)) for _ in range(rng.randint(30, 70))]
        v = version if not (turn == 1 and rng.random() < 0.05) else version + 1
        ids += sampled
        mask += [1] * len(sampled)
        lps += [-rng.expovariate(2.0) for _ in sampled]
        versions += [v] * len(sampled)
        turn_versions.append(v)
        if turn == 0:
            env = [rng.randrange(len(WORDS)) for _ in range(rng.randint(10, 25))]
            ids += env
            mask += [0] * len(env)
            lps += [0.0] * len(env)
            versions += [-1] * len(env)
    correct = rng.random() < min(0.9, 0.2 + 0.02 * step)
    status = rng.choices(list(Status), weights=[90, 6, 2, 2])[0]
    question = f"task {task}: what is {task} + {step}?"
    answer = "<b>bold?</b> " + (HOSTILE if task % 7 == 3 else f"the answer is {task + step}")
    messages = [
        {"role": "system", "content": "You are a careful solver. Use the calc tool."},
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": "let me compute",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "calc",
                        "arguments": json.dumps({"expr": f"{task}+{step}"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "name": "calc", "content": str(task + step)},
        {"role": "assistant", "content": answer},
    ]
    metadata = {"group": task, "env_id": "vime/Math-v0" if task % 5 else "vime/Code-v0"}
    if trainer:
        metadata["trainer_logprobs"] = [
            lp + (rng.gauss(0, 0.02) if m else 0.0) for lp, m in zip(lps, mask, strict=True)
        ]
    drift = 1.0 if rng.random() < 0.03 else 0.0
    if drift:  # the second prompt re-tokenised the first reply's end differently
        metadata["drift_at"] = [mask.index(0, len(prompt)) - 2]
    return Trajectory(
        token_ids=ids,
        loss_mask=mask,
        logprobs=lps,
        prompt_length=len(prompt),
        messages=messages,
        reward=float(correct),
        turn_rewards=[0.0, float(correct)],
        status=status,
        weight_versions=turn_versions,
        token_versions=versions,
        task_id=f"task-{task}",
        sample_index=sample,
        error="engine_error: boom" if status is Status.FAILED else None,
        metrics={
            "correct": float(correct),
            "num_turns": 2.0,
            "drift_count": drift,
            "drift_masked_tokens": 3 * drift,
        },
        metadata=metadata,
    )


def make_run(out: Path, *, steps: int = 4, groups: int = 4, n: int = 4, seed: int = 0) -> Path:
    """Write a train dir of ``steps x groups x n`` episodes; return ``out``."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out / "tokenizer")
    config = {"run": {"model": str(tokenizer)}, "rollout": {"env_id": "vime/Math-v0"}}
    (out / "config.json").write_text(json.dumps(config))
    dumps = out / "trajectories"
    dumps.mkdir(exist_ok=True)
    with open(out / "metrics.jsonl", "w") as metrics:
        metrics.write(json.dumps({"step": 0, "eval/pass@1": 0.2, "eval/mean_reward": 0.2}) + "\n")
        for step in range(1, steps + 1):
            batch = [
                episode(rng, step, g + step * groups, s, trainer=True)
                for g in range(groups)
                for s in range(n)
            ]
            write_jsonl(batch, dumps / f"step_{step:06d}.jsonl", step=step)
            rewards = [t.reward for t in batch]
            row = {
                "step": step,
                "rollout/reward_mean": sum(rewards) / len(rewards),
                "rollout/accuracy": sum(rewards) / len(rewards),
                "rollout/response_len_mean": sum(sum(t.loss_mask) for t in batch) / len(batch),
                "mismatch/abs_diff_mean": 0.016 + 0.001 * math.sin(step),
                "mismatch/kl_k3": 2e-4,
                "policy/approx_kl": 1e-3 * step,
                "policy/entropy": 1.5 - 0.01 * step,
                "train/grad_norm": 0.5 + rng.random(),
                "time/rollout_s": 10 + rng.random(),
                "time/train_s": 20 + rng.random(),
                "time/sync_s": 1.0,
            }
            if step % 2 == 0:
                row.update(
                    {"eval/pass@1": 0.2 + 0.02 * step, "eval/mean_reward": 0.25 + 0.02 * step}
                )
            metrics.write(json.dumps(row) + "\n")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    args = parser.parse_args()
    print(make_run(args.out, steps=args.steps, groups=args.groups, n=args.n))
