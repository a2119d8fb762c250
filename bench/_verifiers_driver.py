"""The peer side of ``bench/rollout_overhead.py``: the same add-tool task on the same stub
server, driven by the PyPI ``verifiers`` package (``vf.ToolEnv``). Runs in a venv of its own
(it never imports Vime) and prints one JSON line with its turns per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


async def drive(url: str, concurrency: int, episodes: int, turns: int) -> dict:
    import httpx
    import verifiers as vf
    from datasets import Dataset
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    rows = [
        {"question": "Count with the add tool, then answer.", "answer": str(turns - 1)}
    ] * episodes

    async def correct(completion, answer, **kwargs) -> float:
        return float(answer in str(completion[-1].get("content") or ""))

    env = vf.ToolEnv(
        eval_dataset=Dataset.from_list(rows),
        tools=[add],
        max_turns=turns + 1,
        rubric=vf.Rubric(funcs=[correct]),
    )
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    oai = AsyncOpenAI(
        base_url=url, api_key="stub", max_retries=0, http_client=httpx.AsyncClient(limits=limits)
    )
    started = time.perf_counter()
    out = await env.evaluate(
        OpenAIChatCompletionsClient(oai),
        model="stub",
        num_examples=episodes,
        rollouts_per_example=1,
        max_concurrent=concurrency,
        sampling_args={"max_tokens": 128, "extra_body": {"return_token_ids": True}},
        on_progress=lambda *args: None,
    )
    elapsed = time.perf_counter() - started
    outputs = out["outputs"]
    done = 0
    for o in outputs:
        completion = o.get("completion") or []
        done += sum(1 for m in completion if _role(m) == "assistant")
    correct_n = sum(1 for o in outputs if (o.get("reward") or 0.0) == 1.0)
    errors = [str(o.get("error"))[:200] for o in outputs if o.get("error")]
    return {
        "framework": "verifiers",
        "version": vf.__version__,
        "concurrency": concurrency,
        "episodes": len(outputs),
        "correct_episodes": correct_n,
        "turns": done,
        "seconds": round(elapsed, 3),
        "turns_per_s": round(done / elapsed, 1),
        "failed_episodes": len(errors),
        "first_error": errors[0] if errors else None,
    }


def _role(message) -> str:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--turns", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(drive(args.url, args.concurrency, args.episodes, args.turns))))


if __name__ == "__main__":
    main()
