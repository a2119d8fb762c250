"""Runs an eval: every (task, sample) not yet in the output dir is played as an episode of
the agent loop (:class:`vime.agents.tool_agent.Episode`, chat mode) against an
:class:`~vime.inference.openai_client.OpenAIClient`, and recorded as it finishes; then the
summary and reports are written. The rows and metrics are those of :mod:`vime.eval.scoring`,
shared with ``vime rollout`` and ``vime train``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

from vime.agents.config import AgentConfig
from vime.agents.tool_agent import Episode, describe_error
from vime.eval.config import EvalConfig
from vime.eval.scoring import result_row
from vime.eval.store import ResultStore
from vime.eval.tasks import resolve_tasks
from vime.inference.openai_client import OpenAIClient, RequestFailed
from vime.inference.sampling import Sampler
from vime.types import Status


def make_env(config: EvalConfig) -> Any:
    """A fresh env of ``config.env`` (with ``--env-kwargs``)."""
    import vime

    return vime.make(config.env, **config.env_kwargs_dict())


async def run_sample(
    env: Any, sampler: Sampler, task: dict[str, Any], sample_index: int, config: EvalConfig
) -> dict[str, Any]:
    """Play one episode of ``task`` and return its results row; never raises for a failed
    request or env error (the row's ``error`` says what happened)."""
    task_id = str(task["id"])
    seed = (config.seed or 0) + sample_index  # the env's reset seed either way
    episode = Episode(
        env,
        sampler,
        config.sampling,
        AgentConfig(mode="chat", max_turns=config.max_turns),
        task=task,
        seed=seed,
        session_id=f"{task_id}/{sample_index}",
        sampling_seed=seed if config.seed is not None else None,
    )
    error, attempts = None, 0
    try:
        await episode.play()
    except RequestFailed as exc:
        error, attempts = str(exc), exc.attempts
    except Exception as exc:  # an env that raises must not lose the sample
        error = f"env_error: {describe_error(exc)[:300]}"
    trajectory = episode.trajectory(
        Status.FAILED if error else None, error, task_id=task_id, sample_index=sample_index
    )
    row = result_row(trajectory, threshold=config.success_threshold)
    row["attempts"] += attempts  # the failed request's, which no turn recorded
    row["seconds"] = round(time.monotonic() - episode.started, 3)
    return row


async def run_pending(
    config: EvalConfig,
    sampler: Sampler,
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
                row = await run_sample(env, sampler, task, index, config)
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
    sampler = OpenAIClient(
        base_url,
        model=model,
        api_key=api_key,
        timeout=config.request_timeout,
        max_retries=config.max_retries,
        backoff=config.retry_backoff,
        requests_per_second=config.requests_per_second,
    )
    try:
        await run_pending(config, sampler, run.tasks, run.store, first_env=run.env)
    finally:
        run.store.close()
        await sampler.close()
    summary = summarize(run.tasks, run.store.results, n=config.n, ks=config.ks)
    write_reports(run.store.dir, summary, run.identity)
    return summary
