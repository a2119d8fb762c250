"""The RL loop: rollouts from vLLM engines, a trainer step, weights back into the engines.

``run_training(setup)`` places a trainer (one Ray actor per rank) and the inference service
(engines + router, one Ray actor) on a Ray cluster, then runs steps synchronously
(on-policy) or asynchronously (rollouts of the next steps overlap training, bounded by
``--max-staleness``), with checkpoints, HF exports, evaluation and metrics along the way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vime.errors import VimeError
from vime.orchestration.batching import (
    PreparedBatch,
    prepare_batch,
    rollout_metrics,
    training_sample_id,
)
from vime.orchestration.cluster import Cluster
from vime.orchestration.metrics_log import MetricsLogger, read_metric_rows
from vime.orchestration.run_state import (
    RunState,
    RunStateError,
    checkpoints_newest_first,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)
from vime.orchestration.setup import TrainSetup
from vime.orchestration.task_stream import TaskStream
from vime.types import Status, Trajectory

if TYPE_CHECKING:
    from vime.agents.template import ChatTemplateRenderer

log = logging.getLogger(__name__)


class RLLoop:
    """One training run over a started :class:`Cluster`."""

    def __init__(
        self,
        setup: TrainSetup,
        cluster: Cluster,
        logger: MetricsLogger,
        tasks: list[dict[str, Any]],
        eval_tasks: list[dict[str, Any]],
        renderer: ChatTemplateRenderer | None = None,
    ) -> None:
        """``renderer``: the model's chat template (default: :func:`chat_renderer` of
        ``--model``, loaded here)."""
        from vime.inference.client import VimeClient
        from vime.rollout import RolloutManager

        self.setup = setup
        self.run = setup.run
        self.cluster = cluster
        self.logger = logger
        self.out = Path(self.run.output_dir)
        self.state = RunState()
        self.buffer: list[list[Trajectory]] = []
        # A request that finds no engine (one restarting after a crash) waits for one as long
        # as the service waits for an engine to start, instead of failing its episode.
        self.client = client = VimeClient(
            cluster.base_url,
            model=cluster.model_name,
            retry_seconds=setup.serve.engine_start_timeout,
        )
        renderer = renderer or chat_renderer(self.run.model)
        self.manager = RolloutManager(setup.rollout, lambda: client, setup.agent, renderer=renderer)
        eval_rollout = type(setup.rollout)(
            **{**setup.rollout.__dict__, "n": 1, "partial_rollout": False, "group_filter": None}
        )
        self.eval_manager = RolloutManager(
            eval_rollout, lambda: client, setup.agent, renderer=renderer
        )
        self.sampling = setup.sampling
        self.eval_sampling = setup.sampling.replace(temperature=0.0, top_p=1.0)
        self.stream = TaskStream(tasks, seed=self.run.seed)
        self.eval_set = eval_tasks
        self.step_times: list[float] = []
        # The running held-out evaluation (its step and task), and the steps already logged
        # with one (a resumed run's come from its metrics.jsonl).
        self._eval: tuple[int, asyncio.Future] | None = None
        self._evaluated = _evaluated_steps(self.out / "metrics.jsonl") if self.run.resume else set()

    # -- state ------------------------------------------------------------------------
    def restore(self) -> bool:
        """Load the newest intact checkpoint of ``--output-dir``; False when there is none.

        A damaged checkpoint (a file truncated, altered or missing) is skipped with a message
        naming it and the one used instead; when none is intact this raises
        :class:`RunStateError` listing what is wrong with each.
        """
        candidates = checkpoints_newest_first(self.out / "checkpoints")
        if not candidates:
            # Killed before its first checkpoint: what it trained is gone with the trainer,
            # so its lines must go too, or their samples would count as trained twice.
            _truncate_lines(self.out / "trained_samples.jsonl", 0)
            return False
        skipped: list[str] = []
        for path in candidates:
            try:
                verify_checkpoint(path)
                self.state, flat = load_checkpoint(path)
                self.cluster.trainer_call("load", str(path / "trainer"))
            except VimeError as exc:  # RunStateError, or the trainer's CheckpointError
                skipped.append(f"{path.name} ({exc})")
                continue
            if skipped:
                message = (
                    f"--resume: the newest checkpoint is unusable: {'; '.join(skipped)}; "
                    f"resuming from {path.name}, the newest intact one"
                )
                log.warning(message)
                print(message, flush=True)
            break
        else:
            raise RunStateError(
                f"--resume: no intact checkpoint in {self.out / 'checkpoints'}: "
                f"{'; '.join(skipped)}. Start again with another --output-dir"
            )
        groups: dict[int, list[Trajectory]] = {}
        for t in flat:
            groups.setdefault(int(t.metadata.get("group", 0)), []).append(t)
        self.buffer = list(groups.values())
        self.stream.position = self.state.data_position
        _truncate_lines(self.out / "trained_samples.jsonl", self.state.trained_samples)
        self.cluster.sync_weights(self.state.weight_version)
        log.info("resumed from %s at step %d", path, self.state.step)
        return True

    def checkpoint(self, data_position: int) -> Path:
        """Save trainer, loop state and unconsumed rollouts atomically."""
        self.state.data_position = data_position
        flat = [t for g in self.buffer for t in g]
        path = save_checkpoint(
            self.out / "checkpoints",
            self.state,
            flat,
            lambda d: self.cluster.trainer_call("save", str(d)),
        )
        prune_checkpoints(self.out / "checkpoints", self.run.keep_checkpoints)
        return path

    # -- one step ---------------------------------------------------------------------
    async def rollout(self) -> tuple[list[list[Trajectory]], dict[str, float], int]:
        """Play one step's tasks; returns groups, metrics and the stream position before."""
        start_position = self.stream.position
        wanted = self.run.rollout_batch_size
        # With --over-sampling the extra tasks give --group-filter groups to choose from; all
        # taken tasks count as consumed, so a resume never replays one.
        budget = self.setup.rollout.launch_budget(wanted)
        tasks = []
        for sample_id, task in self.stream.take(budget):
            tasks.append({**task, "id": sample_id, "source_id": task.get("id")})
        t = time.perf_counter()
        batch = await self.manager.generate(tasks, self.sampling, num_groups=wanted)
        metrics = {f"rollout/{k}": v for k, v in batch.metrics.items()}
        # Reward and the other episode metrics cover every finished episode, also those of
        # groups the filter left out: over the kept groups alone they would flatter the policy.
        everything = [t for g in batch.groups + batch.dropped for t in g]
        if everything and all(t.status is Status.FAILED for t in everything):
            # Every episode failing is a broken setup (env, tools, engine), not bad luck.
            raise VimeError(
                f"step {self.state.step + 1}: all {len(everything)} episodes failed; the first "
                f"error: {everything[0].error}"
            )
        metrics.update(rollout_metrics(everything))
        metrics["time/rollout_s"] = time.perf_counter() - t
        return batch.groups, metrics, start_position

    def train(self, groups: list[list[Trajectory]], max_staleness: int | None) -> dict[str, float]:
        """Advantages, one optimizer step, weights to the engines; returns metrics.

        Colocated engines are paused while the trainer has the devices and resumed after
        every step, explicitly: also when nothing trained or no weights were pushed, and
        when the step failed (a weight update's own resume is not relied on).
        """
        try:
            return self._train(groups, max_staleness)
        finally:
            if self.run.colocate:
                self.cluster.resume_engines()

    def _train(self, groups: list[list[Trajectory]], max_staleness: int | None) -> dict[str, float]:
        from vime.training.batch import TrainBatch, TrainSample

        prepared: PreparedBatch = prepare_batch(
            groups,
            self.setup.advantage,
            current_version=self.state.weight_version,
            max_staleness=max_staleness,
        )
        metrics = {f"rollout/dropped_{k}": float(v) for k, v in prepared.dropped.items()}
        if not prepared.trajectories:
            log.warning(
                "step %d: no trajectory could train (%s); skipping",
                self.state.step,
                prepared.dropped,
            )
            return metrics
        samples = [
            TrainSample.from_trajectory(t, a, sample_id=training_sample_id(t))
            for t, a in zip(prepared.trajectories, prepared.advantages, strict=True)
        ]
        t0 = time.perf_counter()
        if self.run.colocate:
            self.cluster.pause_engines()
        train_metrics = self.cluster.trainer_call("train_step", TrainBatch(samples))
        metrics["time/train_s"] = time.perf_counter() - t0
        metrics.update(_prefixed(train_metrics, "train/"))
        if self.run.dump_trajectories:
            _keep_trainer_logprobs(
                prepared.trajectories, self.cluster.trainer_call("step_logprobs")
            )
        t1 = time.perf_counter()
        self.state.weight_version += 1
        metrics.update(self.cluster.sync_weights(self.state.weight_version))
        metrics["time/sync_s"] = time.perf_counter() - t1
        with (self.out / "trained_samples.jsonl").open("a") as f:
            for s in samples:
                f.write(json.dumps({"step": self.state.step, "sample_id": s.sample_id}) + "\n")
        self.state.trained_samples += len(samples)
        return metrics

    def after_step(
        self, metrics: dict[str, float], groups: list[list[Trajectory]], data_position: int
    ) -> None:
        """Dumps, logging, checkpoints and exports once a step is done (its evaluation starts
        after them: :meth:`_start_eval`)."""
        self.state.step += 1
        step = self.state.step
        if self.run.dump_trajectories:
            from vime.rollout import write_jsonl

            dump_dir = self.out / "trajectories"
            dump_dir.mkdir(parents=True, exist_ok=True)
            dump = dump_dir / f"step_{step:06d}.jsonl"
            dump.unlink(missing_ok=True)  # a resumed run redoes the step: keep one copy
            write_jsonl([t for g in groups for t in g], dump, step=step)
        metrics["weight_version"] = float(self.state.weight_version)
        self.logger.log(step, metrics)
        last = step >= self.run.num_steps
        if last or (self.run.save_interval and step % self.run.save_interval == 0):
            self.checkpoint(data_position)
        if last or (self.run.export_interval and step % self.run.export_interval == 0):
            self.export(step)

    async def evaluate(self) -> dict[str, float]:
        """Greedy pass@1 and mean reward on the held-out tasks, as ``vime eval`` scores them
        (a failed episode counts as incorrect, with reward 0)."""
        from vime.eval.scoring import score

        if not self.eval_set:
            return {}
        t = time.perf_counter()
        batch = await self.eval_manager.generate(self.eval_set, self.eval_sampling)
        summary = score(batch.trajectories + [t for g in batch.dropped for t in g])
        return {
            "eval/mean_reward": summary["mean_reward"],
            "eval/pass@1": summary["pass@1"],
            "eval/failed": float(summary["num_failed"]),
            "time/eval_s": time.perf_counter() - t,
        }

    def _start_eval(self, step: int) -> None:
        """Start evaluating the weights the engines hold now, those of ``step``, when due (the
        starting weights, then every ``--eval-interval`` steps) and not logged yet.

        It runs beside the next step's rollouts (one engine batch of both keeps a small engine
        busier than two in turn), and :meth:`_log_eval` awaits it before the engines' weights
        change or the run ends."""
        interval = self.run.eval_interval
        if not interval or step % interval or step in self._evaluated:
            return
        self._evaluated.add(step)
        self._eval = (step, asyncio.ensure_future(self.evaluate()))

    async def _log_eval(self) -> None:
        """Wait for the running evaluation, if any, and log it as a row of its step."""
        if self._eval is not None:
            step, task = self._eval
            self._eval = None
            self.logger.log(step, await task)

    async def _cancel_eval(self) -> None:
        if self._eval is not None:
            task = self._eval[1]
            self._eval = None
            await _cancel(task)

    def export(self, step: int) -> Path:
        """Write ``exports/step_<N>`` as a plain HF folder."""
        target = self.out / "exports" / f"step_{step:06d}"
        return Path(self.cluster.trainer_call("save_hf", str(target.resolve())))

    # -- drivers ----------------------------------------------------------------------
    async def close(self) -> None:
        """Close the engines' client (the drivers do it when they end)."""
        await self.client.close()

    async def run_sync(self, progress: Any) -> None:
        """On-policy: each step's rollouts use the weights of the step before."""
        self._start_eval(self.state.step)
        try:
            while self.state.step < self.run.num_steps:
                groups, metrics, _ = await self.rollout()
                await self._log_eval()
                metrics.update(await asyncio.to_thread(self.train, groups, None))
                await self._finish_step(metrics, groups, self.stream.position, progress)
            await self._log_eval()
        finally:
            await self._cancel_eval()
            await self.close()

    async def run_async(self, progress: Any) -> None:
        """Rollouts for the next steps run while the trainer trains (bounded staleness).

        The producer may start a batch only while fewer than ``--max-staleness`` batches are
        generated or queued ahead of the trainer, so a batch started at version v is trained
        at version v + K at the latest; trajectories staler than that are not admitted.
        """
        ahead = asyncio.Semaphore(max(1, self.run.max_staleness))
        queue: asyncio.Queue = asyncio.Queue()
        waiting: list[tuple] = []  # what the queue holds, in order, for the checkpoint's buffer
        if self.buffer:  # rolled out before the checkpoint, not trained yet
            await ahead.acquire()
            flat = [t for g in self.buffer for t in g]
            waiting.append((self.buffer, rollout_metrics(flat), self.state.data_position))
            await queue.put(waiting[-1])
        self.buffer = []
        positions: list[int] = []

        async def produce() -> None:
            while True:
                await ahead.acquire()
                positions.append(self.stream.position)
                item = await self.rollout()
                waiting.append(item)
                await queue.put(item)
                positions.remove(item[2])

        self._start_eval(self.state.step)
        producer = asyncio.create_task(produce())
        try:
            while self.state.step < self.run.num_steps:
                groups, metrics, _ = await _next_batch(queue, producer)
                await self._log_eval()
                waiting.pop(0)
                ahead.release()
                metrics = dict(metrics)
                metrics.update(await asyncio.to_thread(self.train, groups, self.run.max_staleness))
                metrics["async/queue_size"] = float(queue.qsize())
                # Queued batches are not trained yet: they go into the checkpoint's buffer,
                # and the tasks being rolled out now are replayed after a resume.
                self.buffer = [g for item in waiting for g in item[0]]
                resume_at = min(positions) if positions else self.stream.position
                await self._finish_step(metrics, groups, resume_at, progress)
            await self._log_eval()
        finally:
            await self._cancel_eval()
            producer.cancel()
            self.manager.abort()
            await asyncio.gather(producer, return_exceptions=True)
            await self.close()

    async def _finish_step(
        self, metrics: dict[str, float], groups: list, position: int, progress: Any
    ) -> None:
        await asyncio.to_thread(self.after_step, metrics, groups, position)
        # After the checkpoint and export, not beside them: on a CPU box they share the cores
        # with the engine, whose OpenMP steps then stall (quickstart's last evaluation: 13 s
        # beside them against 3 s after them).
        self._start_eval(self.state.step)
        self.step_times.append(
            sum(metrics.get(k, 0.0) for k in ("time/rollout_s", "time/train_s", "time/sync_s"))
        )
        progress(self.state.step, metrics)


def chat_renderer(model: str) -> ChatTemplateRenderer:
    """The chat template renderer of ``model``'s tokenizer (a local folder)."""
    from transformers import AutoTokenizer

    from vime.agents.template import ChatTemplateRenderer

    return ChatTemplateRenderer(AutoTokenizer.from_pretrained(model))


async def _cancel(task: asyncio.Future | None) -> None:
    """Cancel ``task`` (if any and still running) and wait for it to end."""
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _next_batch(queue: asyncio.Queue, producer: asyncio.Task) -> Any:
    """The next rolled-out batch, or the error that stopped the producer (a rollout whose
    every episode failed, say): waiting on the queue alone would wait forever."""
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
    finally:
        getter.cancel()  # a no-op once it has its item
    producer.result()  # raises what stopped it
    raise VimeError("the rollout producer stopped without an error")


def _evaluated_steps(path: Path) -> set[int]:
    """The steps that ``metrics.jsonl`` at ``path`` holds a held-out evaluation of."""
    return {int(r["step"]) for r in read_metric_rows(path) if "eval/pass@1" in r and "step" in r}


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {(k if "/" in k else prefix + k): v for k, v in metrics.items()}


def _keep_trainer_logprobs(trajectories: list[Trajectory], logprobs: list[Any]) -> None:
    """Put the trainer's logprobs of each trained sample into its ``metadata`` (key
    ``trainer_logprobs``, aligned with ``token_ids``, 0.0 outside the loss mask), where the
    step's dump carries them to ``vime view``; nothing when the backend does not keep them."""
    if not logprobs:
        return
    for t, lps in zip(trajectories, logprobs, strict=True):
        t.metadata["trainer_logprobs"] = [
            round(lp, 6) if m else 0.0 for lp, m in zip(lps.tolist(), t.loss_mask, strict=True)
        ]


def _truncate_lines(path: Path, keep: int) -> None:
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    if len(lines) != keep:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(lines[:keep]))
        os.replace(tmp, path)
