"""The running pieces of a training run on Ray: trainer ranks and the inference service."""

from __future__ import annotations

import functools
import logging
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from vime.errors import VimeError
from vime.hardware import preload_tcmalloc
from vime.orchestration.placement import PlacementPlan, plan_placement
from vime.orchestration.run_state import latest_checkpoint_name
from vime.orchestration.setup import TrainSetup

log = logging.getLogger(__name__)
T = TypeVar("T")


class ActorDiedError(VimeError):
    """A trainer rank or the inference service died; the run cannot go on without it."""


def detect_device() -> str:
    """GPU when this machine (the driver's) sees CUDA devices, else CPU."""
    import torch

    return "GPU" if torch.cuda.is_available() else "CPU"


def trainer_env_vars(gpu: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables the trainer ranks start with beyond the driver's: CPU ranks get
    tcmalloc preloaded when it is installed (a train step allocates and frees its activations
    each micro-batch, and glibc's malloc faults their pages in again every time)."""
    if gpu:
        return {}
    env = dict(os.environ if base is None else base)
    before = env.get("LD_PRELOAD")
    preload_tcmalloc(env)
    return {"LD_PRELOAD": env["LD_PRELOAD"]} if env.get("LD_PRELOAD") != before else {}


class Cluster:
    """Creates the placement groups and actors of a plan, and talks to them."""

    def __init__(self, setup: TrainSetup, device: str) -> None:
        self.setup = setup
        self.device = device
        self.plan: PlacementPlan = plan_placement(setup.placement(device))
        self.trainers: list[Any] = []
        self.inference: Any = None
        self.info: dict[str, Any] = {}
        self._groups: dict[str, Any] = {}
        self.run_id = uuid.uuid4().hex[:8]

    @property
    def base_url(self) -> str:
        """The router's OpenAI base URL."""
        return self.info["base_url"]

    @property
    def model_name(self) -> str:
        """The model name the engines serve."""
        return self.info["model_name"]

    def start(self, meanwhile: Callable[[], T] | None = None) -> T | None:
        """Place and start the trainer ranks and the inference service; returns what
        ``meanwhile()`` returns, run here once the trainer ranks are built and while the
        engines may still be starting (on a 2-core box, the one core they leave idle)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from vime.orchestration.ray_cluster import create_placement_groups
        from vime.orchestration.workers import InferenceWorker, TrainerWorker

        self._groups = create_placement_groups(self.plan)
        gpu = 1.0 if self.device == "GPU" else 0.0
        trainer_pg = self._groups[self.plan.trainer_group]
        engine_pg = self._groups[self.plan.engine_group]
        share_t, share_e = self.plan.trainer_device_share, self.plan.engine_device_share
        bundles = self.plan.groups[self.plan.trainer_group]
        cpus = [b.resources["CPU"] for b in bundles]
        world = self.setup.run.trainer_num_processes
        # Engines need no Ray CPU of their own beyond their actor: vLLM's processes are its
        # children. On CPU, sync mode lets the trainer use every core between rollouts.
        all_cores = os.cpu_count() or 1
        threads = all_cores if self.setup.run.mode == "sync" else max(1, all_cores // 2)
        threads = max(1, threads // world)

        def strategy(pg: Any, index: int) -> Any:
            return PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            )

        engine_gpu_ids = self._engine_gpu_ids(engine_pg, gpu, share_e)
        owner = (os.getpid(), socket.gethostname())  # actors exit if this driver is killed
        worker_cls = ray.remote(InferenceWorker)
        serve = self.setup.serve
        self.inference = worker_cls.options(
            num_cpus=min(cpus[0], 1.0) * share_e,
            num_gpus=0,
            scheduling_strategy=strategy(engine_pg, 0),
            runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ",".join(engine_gpu_ids)}}
            if engine_gpu_ids
            else None,
        ).remote(serve, owner=owner)
        starting = self.inference.start.remote()

        master = None
        trainer_cls = ray.remote(TrainerWorker)
        trainer_env = trainer_env_vars(gpu=bool(gpu))
        for rank in range(world):
            options: dict[str, Any] = {
                "num_cpus": cpus[rank] * share_t,
                "num_gpus": gpu * share_t,
                "scheduling_strategy": strategy(trainer_pg, rank),
            }
            if trainer_env:
                options["runtime_env"] = {"env_vars": trainer_env}
            if master is None:
                probe = ray.remote(_node_and_port).options(**options).remote()
                master = ray.get(probe)
            self.trainers.append(
                trainer_cls.options(**options).remote(
                    self.setup.trainer,
                    self.setup.loss,
                    rank=rank,
                    world_size=world,
                    master_addr=master[0],
                    master_port=master[1],
                    num_threads=threads,
                    owner=owner,
                    megatron_args=self.setup.megatron_args,
                )
            )
        ray.get([t.weight_version.remote() for t in self.trainers])  # constructed
        done = meanwhile() if meanwhile is not None else None
        self.info = ray.get(starting)
        self.trainer_node = ray.get(self.trainers[0].node.remote())
        log.info("engines at %s (router %s)", self.info["engine_urls"], self.base_url)
        self.nodes_line = f"trainer rank 0 on node {self.trainer_node[:12]}, engines on node {self.info['node'][:12]}"
        return done

    def _engine_gpu_ids(self, pg: Any, gpu: float, share: float) -> list[str]:
        """The GPU ids Ray reserved for each engine bundle (vLLM takes them itself)."""
        if not gpu:
            return []
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ids = []
        for index in range(len(self.plan.groups[self.plan.engine_group])):
            probe = ray.remote(_gpu_ids).options(
                num_cpus=0,
                num_gpus=gpu * share,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=index
                ),
            )
            ids += ray.get(probe.remote())
        return ids

    def trainer_call(self, method: str, *args: Any) -> Any:
        """Call ``method`` on every trainer rank (a collective) and return rank 0's result."""
        refs = [getattr(t, method).remote(*args) for t in self.trainers]
        return self._get(refs, f"trainer's {method}")[0]

    def _get(self, refs: Any, what: str) -> Any:
        """``ray.get(refs)``; a dead actor becomes one :class:`ActorDiedError` with a
        ``--resume`` hint (the survivors are stopped by the driver's cleanup)."""
        import ray

        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as exc:
            reason = str(exc).strip().splitlines()[0][:300]
            last = latest_checkpoint_name(Path(self.setup.run.output_dir) / "checkpoints")
            resume = (
                f"continues from {last}" if last else "starts again at step 0 (no checkpoint yet)"
            )
            raise ActorDiedError(
                f"the run stopped: an actor died during the {what} ({reason}). Rerun the same "
                f"command with --resume; it {resume}"
            ) from None

    def export_weights_folder(self, name: str) -> str:
        """Have the trainer write its weights into a folder on the trainer's node."""
        from vime.inference.weights import weights_root

        folder = str(weights_root() / f"{self.run_id}-{name}")
        return self.trainer_call("export_to_folder", folder, self.sync_dtype)

    @functools.cached_property
    def sync_dtype(self) -> str | None:
        """The engines' weight dtype where known: the sync writes that, not fp32 masters."""
        from vime.inference.weights import engine_dtype

        return engine_dtype(self.setup.serve.vllm_args, self.setup.run.model)

    def sync_weights(self, version: int) -> dict[str, float]:
        """Trainer weights into every engine as ``version`` (through /dev/shm or Ray)."""

        # Two folders in turn: the engines keep the newest for a restarted engine's reload,
        # and the trainer rewrites the other in place (no new shared memory to allocate).
        folder = self.export_weights_folder(f"sync{version % 2}")
        if self.trainer_node == self.info["node"]:
            metrics = self._get(
                self.inference.update_from_folder.remote(folder, version), "weight update"
            )
            return {**metrics, "sync/cross_node": 0.0}
        files = self.trainers[0].read_folder.remote(folder)
        try:
            metrics = self._get(
                self.inference.update_from_files.remote(files, version), "weight update"
            )
        finally:
            self.trainer_call("remove_folder", folder)
        return {**metrics, "sync/cross_node": 1.0}

    def pause_engines(self) -> None:
        """Colocated placement: stop generation while the trainer uses the devices."""
        self._get(self.inference.pause.remote(), "engines' pause")

    def resume_engines(self) -> None:
        """Colocated placement: let the engines generate again after a train step."""
        self._get(self.inference.resume.remote(), "engines' resume")

    def stop(self) -> None:
        """Stop the engines and router, then the actors and placement groups."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.inference is not None:
            try:
                ray.get(self.inference.stop.remote(), timeout=120)
            except Exception as exc:  # the actor may already be gone
                log.warning("stopping the inference service: %s", exc)
        for actor in [*self.trainers, self.inference]:
            if actor is not None:
                ray.kill(actor)
        for pg in self._groups.values():
            remove_placement_group(pg)


def _node_and_port() -> tuple[str, int]:
    import socket

    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def _gpu_ids() -> list[str]:
    import ray

    return [str(g) for g in ray.get_gpu_ids()]
