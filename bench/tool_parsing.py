"""Tool-call cost per turn: microseconds to parse one model message with Vime's parsers, beside
vLLM's own hermes and llama3_json parsers on the same messages (``--vllm``), and the overhead of
``execute_tool_calls`` per call for trivial sync and async tools and for rejected calls.

    .venv/bin/python bench/tool_parsing.py --messages 2000 --vllm --out tool_parsing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from vime.envs.tools import execute_tool_calls, tool
from vime.tool_parsers import get_parser
from vime.types import ToolCall


def messages(family: str, count: int, seed: int = 0) -> list[str]:
    """Model-like messages: a sentence of content, then one to three calls."""
    rng = random.Random(seed)
    parser = get_parser(family)
    out = []
    for _ in range(count):
        calls = [
            ToolCall(
                rng.choice(["search", "read_file", "calculator"]),
                {
                    "query": " ".join(rng.choices(["alpha", "beta", "gamma", "x"], k=6)),
                    "n": rng.randint(1, 99),
                },
            )
            for _ in range(rng.randint(1, 3))
        ]
        rendered = parser.render(calls)
        out.append(rendered if family == "llama3" else f"Let me look this up.\n{rendered}")
    return out


def per_message_us(parse: Any, texts: list[str], repeats: int = 3) -> float:
    """Best of ``repeats`` runs over all texts, in microseconds per message."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for text in texts:
            parse(text)
        best = min(best, time.perf_counter() - start)
    return best / len(texts) * 1e6


def vllm_parsers() -> dict[str, Any]:
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser

    class Tokenizer:
        def get_vocab(self) -> dict[str, int]:
            return {"<tool_call>": 1, "</tool_call>": 2, "<|python_tag|>": 3}

    return {
        "hermes": Hermes2ProToolParser(Tokenizer()),
        "llama3": Llama3JsonToolParser(Tokenizer()),
    }


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def echo(text: str) -> str:
    """Echo text."""
    return text


async def execution_us(calls: list[ToolCall], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        await execute_tool_calls([add, echo], calls)
    return (time.perf_counter() - start) / (rounds * len(calls)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=300, help="execute_tool_calls rounds per case")
    ap.add_argument("--vllm", action="store_true", help="also time vLLM's parsers (slow import)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()

    results: dict[str, Any] = {"parse_us_per_message": {}, "execute_us_per_call": {}}
    theirs = vllm_parsers() if args.vllm else {}
    print(f"{'parse (us/message)':<22}{'vime':>10}{'vllm':>10}")
    for family in ["hermes", "llama3", "xml"]:
        texts = messages(family, args.messages)
        ours = per_message_us(get_parser(family).parse, texts)
        row = {"vime": round(ours, 1)}
        if family in theirs:
            row["vllm"] = round(
                per_message_us(lambda t, p=theirs[family]: p.extract_tool_calls(t, None), texts), 1
            )
        results["parse_us_per_message"][family] = row
        print(f"{family:<22}{row['vime']:>10}{row.get('vllm', '-'):>10}")

    cases = {
        "sync tool": [ToolCall("add", {"a": 1, "b": 2})],
        "async tool": [ToolCall("echo", {"text": "hi"})],
        "invalid arguments": [ToolCall("add", {"a": "x"})],
        "unknown tool": [ToolCall("ad", {})],
    }
    print(f"\n{'execute (us/call)':<22}{'vime':>10}")
    for label, calls in cases.items():
        us = asyncio.run(execution_us(calls, args.rounds))
        results["execute_us_per_call"][label] = round(us, 1)
        print(f"{label:<22}{us:>10.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
