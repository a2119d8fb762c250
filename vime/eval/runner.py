"""Runs an eval: every (task, sample) not yet in the output dir is played as a text-only
episode (``env.areset``/``env.astep`` driven by :class:`~vime.eval.client.EvalClient`) and
recorded as it finishes; then the summary and reports are written.

Why not the agent loop (``vime.agents``): it records token ids and checks the engine's prompt
ids turn by turn, which a remote OpenAI-compatible API does not return (and may reject the
vLLM-only request fields that ask for them). Evaluation needs text, rewards and a per-sample
failure record, so it talks plain chat completions and works with any endpoint.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from vime.eval.client import EvalClient, RequestFailed
from vime.eval.config import EvalConfig
from vime.eval.store import ResultStore
from vime.eval.tasks import resolve_tasks

RESPONSE_CHARS = 2000  # of the last reply, kept per sample for reading failures later


def make_env(config: EvalConfig) -> Any:
    """A fresh env of ``config.env`` (with ``--env-kwargs``)."""
    import vime

    return vime.make(config.env, **config.env_kwargs_dict())


async def run_sample(
    env: Any, client: EvalClient, task: dict[str, Any], sample_index: int, config: EvalConfig
) -> dict[str, Any]:
    """Play one episode of ``task`` and return its results row; never raises for a failed
    request or env error (the row's ``error`` says what happened)."""
    task_id = str(task["id"])
    seed = (config.seed or 0) + sample_index  # the env's reset seed either way
    sampling: dict[str, Any] = {
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_tokens": config.max_tokens,
    }
    if config.seed is not None:
        sampling["seed"] = seed
    row: dict[str, Any] = {
        "task_id": task_id,
        "sample_index": sample_index,
        "reward": 0.0,
        "correct": False,
        "answer": None,
        "error": None,
        "turns": 0,
        "finish_reason": "",
        "attempts": 0,
        "response": "",
    }
    started = time.monotonic()
    info: dict[str, Any] = {}
    reward = 0.0
    try:
        observation, _ = await env.areset(seed=seed, options={"task": task})
        messages = list(observation)
        tools = list(env.tool_schemas or []) or None
        for _ in range(config.max_turns):
            reply = await client.chat(
                messages, tools=tools, sampling=sampling, sample_key=f"{task_id}/{sample_index}"
            )
            row["turns"] += 1
            row["attempts"] += reply.attempts
            row["finish_reason"] = reply.finish_reason
            row["response"] = reply.text[-RESPONSE_CHARS:]
            action = {
                k: v for k, v in reply.message.items() if k in ("role", "content", "tool_calls")
            }
            messages.append(action)
            observation, step_reward, terminated, truncated, info = await env.astep(action)
            reward += float(step_reward)
            messages.extend(observation)
            if terminated or truncated:
                break
    except RequestFailed as exc:
        row["error"] = str(exc)
        row["attempts"] += exc.attempts
    except Exception as exc:  # an env that raises must not lose the sample
        row["error"] = f"env_error: {type(exc).__name__}: {str(exc)[:300]}"
    if row["error"] is None:
        row["reward"] = reward
        flag = (info or {}).get("correct")
        row["correct"] = bool(flag) if flag is not None else reward >= config.success_threshold
        answer = (info or {}).get("extracted_answer")
        row["answer"] = str(answer) if answer not in (None, "") else None
    row["seconds"] = round(time.monotonic() - started, 3)
    return row


async def run_pending(
    config: EvalConfig,
    client: EvalClient,
    tasks: list[dict[str, Any]],
    store: ResultStore,
    first_env: Any = None,
) -> int:
    """Run every sample of ``tasks`` that ``store`` does not hold; return how many ran."""
    from tqdm import tqdm

    pending = [
        (task, i)
        for task in tasks
        for i in range(config.n)
        if not store.done(str(task["id"]), i, retry_failed=config.retry_failed)
    ]
    total = len(tasks) * config.n
    bar = tqdm(
        total=total,
        initial=total - len(pending),
        unit="sample",
        file=sys.stderr,
        dynamic_ncols=True,
    )
    queue: asyncio.Queue = asyncio.Queue()
    for item in pending:
        queue.put_nowait(item)
    envs = [first_env] if first_env is not None else []
    failed = 0

    async def worker() -> None:
        nonlocal failed
        env = envs.pop() if envs else make_env(config)
        try:
            while not queue.empty():
                task, index = queue.get_nowait()
                row = await run_sample(env, client, task, index, config)
                store.append(row)
                failed += row["error"] is not None
                bar.update(1)
                bar.set_postfix(failed=failed)
        finally:
            env.close()

    try:
        workers = min(config.concurrency, len(pending))
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        bar.close()
        for env in envs:  # the first env, when nothing was pending
            env.close()
    return len(pending)


@dataclass
class PreparedRun:
    """An eval whose tasks are resolved and whose output dir is checked and open."""

    config: EvalConfig
    env: Any
    tasks: list[dict[str, Any]]
    identity: dict[str, Any]
    store: ResultStore


def prepare(config: EvalConfig, model_id: str) -> PreparedRun:
    """Resolve the tasks and open the output dir (refusing another config's results) before
    any engine starts, so a mistake costs nothing."""
    env = make_env(config)
    try:
        tasks = resolve_tasks(
            env, path=config.tasks, num_tasks=config.num_tasks, seed=config.task_seed
        )
        identity = config.identity(model_id, [str(t["id"]) for t in tasks])
        store = ResultStore(config.output, identity, overwrite=config.overwrite)
    except BaseException:
        env.close()
        raise
    return PreparedRun(config, env, tasks, identity, store)


async def evaluate(
    config: EvalConfig,
    *,
    base_url: str,
    model: str,
    api_key: str = "EMPTY",
    prepared: PreparedRun | None = None,
) -> dict[str, Any]:
    """Run (or resume) the eval in ``config.output`` and write its reports; return the summary.

    ``model`` is the name at ``base_url``; ``prepared`` (from :func:`prepare`) may carry a
    more precise model identity, such as the served folder.
    """
    from vime.eval.report import summarize, write_reports

    run = prepared or prepare(config, model)
    client = EvalClient(
        base_url,
        model=model,
        api_key=api_key,
        timeout=config.request_timeout,
        max_retries=config.max_retries,
        backoff=config.retry_backoff,
        requests_per_second=config.requests_per_second,
    )
    try:
        await run_pending(config, client, run.tasks, run.store, first_env=run.env)
    finally:
        run.store.close()
    summary = summarize(run.tasks, run.store.results, n=config.n, ks=config.ks)
    write_reports(run.store.dir, summary, run.identity)
    return summary
