"""Fast specs of the inference layer: config, command lines and weight-update sequencing,
against fakes (the client's are in test_client_stub.py; the real engines in the slow tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import torch

from vime.cli.main import parse_args
from vime.config.schema import build
from vime.errors import ConfigError
from vime.inference.config import ServeConfig
from vime.inference.engines import engine_argv, engine_env, served_model_name
from vime.inference.errors import InferenceError
from vime.inference.router import router_argv
from vime.inference.server_main import FORK_ENGINE_CORE
from vime.inference.weights import WeightUpdater, write_weights
from vime.training.buckets import bucket_tensors


def _serve_config(argv: list[str]) -> ServeConfig:
    args = parse_args(["serve", *argv])
    return build(ServeConfig, args, vllm_args=args.vllm_args, router_args=args.router_args)


def test_serve_flags_build_a_typed_config_with_forwarded_flags() -> None:
    cfg = _serve_config(
        [
            "--model", "/m/SmolLM2", "--rollout-num-engines", "2",
            "--vllm-router-port", "8123", "--vllm-max-model-len", "1024",
            "--vllm-enforce-eager", "--router-policy", "round_robin",
        ]
    )  # fmt: skip
    assert (cfg.model, cfg.rollout_num_engines, cfg.vllm_router_port) == ("/m/SmolLM2", 2, 8123)
    assert cfg.vllm_args == ["--max-model-len", "1024", "--enforce-eager"]
    assert cfg.router_args == ["--policy", "round_robin"]


def test_serve_without_model_is_an_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        _serve_config(["--rollout-num-engines", "1"])
    assert "the following arguments are required: --model" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rollout-num-engines", "0"], "--rollout-num-engines must be at least 1, got 0"),
        (["--vllm-router-port", "70000"], "--vllm-router-port must be in 0..65535, got 70000"),
        (["--vllm-port", "9000"], "--vllm-port is set by Vime per engine"),
        (["--router-worker-urls", "http://x"], "--router-worker-urls is set by Vime"),
    ],
)
def test_contradictory_serve_flags_are_rejected(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _serve_config(["--model", "m", *argv])


def test_engine_command_forwards_vllm_flags_after_vimes_own() -> None:
    cfg = ServeConfig(model="/models/tiny", vllm_args=["--max-model-len", "512"])
    argv = engine_argv(cfg, 8301, python="py")
    assert argv[:3] == ["py", "-m", "vime.inference.server_main"]
    assert argv[argv.index("--port") + 1] == "8301"
    assert argv[argv.index("--worker-extension-cls") + 1].endswith("VimeWorkerExtension")
    assert argv[argv.index("--middleware") + 1].endswith("WeightVersionMiddleware")
    assert argv[argv.index("--served-model-name") + 1 :][:2] == ["tiny", "/models/tiny"]
    assert argv[-2:] == ["--max-model-len", "512"]


def test_cpu_engines_run_eager_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "--enforce-eager" in engine_argv(ServeConfig(model="m"), 1)
    told = engine_argv(ServeConfig(model="m", vllm_args=["--no-enforce-eager"]), 1)
    assert "--enforce-eager" not in told
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert "--enforce-eager" not in engine_argv(ServeConfig(model="m"), 1)


def test_user_served_model_name_replaces_the_default() -> None:
    cfg = ServeConfig(model="/models/tiny", vllm_args=["--served-model-name", "policy"])
    argv = engine_argv(cfg, 1)
    assert argv.count("--served-model-name") == 1 and argv[-1] == "policy"
    assert served_model_name("/a/b/") == "b"


def test_engine_env_turns_on_rl_routes_and_sizes_the_cpu_kv_cache() -> None:
    env = engine_env(ServeConfig(model="m", cpu_kvcache_gib=2), 0, base={"PATH": "/bin"})
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_a_cpu_engine_preloads_tcmalloc_unless_an_allocator_is_preloaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ctypes.util

    from vime.inference import engines

    monkeypatch.setattr(engines, "_gpu_ids", lambda: [])
    found = {"tcmalloc_minimal": "libtcmalloc_minimal.so.4"}
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: found.get(name))
    cfg = ServeConfig(model="m")
    assert engine_env(cfg, 0, base={})["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    env = engine_env(cfg, 0, base={"LD_PRELOAD": "/x/libfoo.so"})
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4:/x/libfoo.so"
    mine = "/opt/libjemalloc.so.2"
    assert engine_env(cfg, 0, base={"LD_PRELOAD": mine})["LD_PRELOAD"] == mine
    found.clear()  # not installed: nothing preloaded
    assert "LD_PRELOAD" not in engine_env(cfg, 0, base={})
    monkeypatch.setattr(engines, "_gpu_ids", lambda: ["0"])  # GPU engines: untouched
    found["tcmalloc_minimal"] = "libtcmalloc_minimal.so.4"
    assert "LD_PRELOAD" not in engine_env(cfg, 0, base={})


def test_a_one_rank_cpu_engine_keeps_its_worker_in_the_engine_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vime.inference import engines

    monkeypatch.setattr(engines, "_gpu_ids", lambda: [])
    monkeypatch.setattr(engines.os, "cpu_count", lambda: 4)
    cfg = ServeConfig(model="m")
    # Ray gives an actor OMP_NUM_THREADS=1; the engine gets one thread per core it binds.
    env = engine_env(cfg, 0, base={"OMP_NUM_THREADS": "1"})
    assert (env["VLLM_ENABLE_V1_MULTIPROCESSING"], env["OMP_NUM_THREADS"]) == ("0", "4")
    assert env[FORK_ENGINE_CORE] == "1"  # and its engine core is forked from the server
    assert engine_env(cfg, 0, base={FORK_ENGINE_CORE: "0"})[FORK_ENGINE_CORE] == "0"
    env = engine_env(cfg, 0, base={"VLLM_CPU_OMP_THREADS_BIND": "0,2-3"})
    assert (env["VLLM_ENABLE_V1_MULTIPROCESSING"], env["OMP_NUM_THREADS"]) == ("0", "3")
    # vLLM's own layout where the user chose it, binds by itself, or runs several ranks.
    assert (
        engine_env(cfg, 0, base={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})[
            "VLLM_ENABLE_V1_MULTIPROCESSING"
        ]
        == "1"
    )
    for bind in ("auto", "nobind", "0-1|2-3"):
        env = engine_env(cfg, 0, base={"VLLM_CPU_OMP_THREADS_BIND": bind})
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env and "OMP_NUM_THREADS" not in env
        assert FORK_ENGINE_CORE not in env
    two_ranks = ServeConfig(model="m", rollout_num_gpus_per_engine=2)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_env(two_ranks, 0, base={})
    assert FORK_ENGINE_CORE not in engine_env(two_ranks, 0, base={})
    monkeypatch.setattr(engines, "_gpu_ids", lambda: ["0"])
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_env(cfg, 0, base={})
    assert FORK_ENGINE_CORE not in engine_env(cfg, 0, base={})


def test_the_server_entry_makes_vllm_cpu_fork_its_engine_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's CPU platform sets spawn while it checks the engine config; the entry point sets
    fork right after that check (and only the CPU platform's)."""
    from vllm.platforms import cpu

    from vime.inference import server_main

    seen = []

    def check(cls, vllm_config) -> None:  # vLLM's own, reduced to what matters here
        seen.append(vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", classmethod(check))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    server_main.fork_engine_core()
    cpu.CpuPlatform.check_and_update_config("config")
    assert seen == ["config"] and os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_engine_env_gives_each_engine_its_own_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    cfg = ServeConfig(model="m", rollout_num_engines=2, rollout_num_gpus_per_engine=2)
    assert engine_env(cfg, 1)["CUDA_VISIBLE_DEVICES"] == "2,3"
    too_many = ServeConfig(model="m", rollout_num_engines=3, rollout_num_gpus_per_engine=2)
    with pytest.raises(ConfigError, match="need 6 GPUs, only 4 are visible"):
        engine_env(too_many, 2)


def test_router_defaults_to_session_affinity_and_user_flags_win() -> None:
    argv = router_argv("127.0.0.1", 9000, ["http://a:1", "http://b:2"], [])
    assert argv[argv.index("--policy") + 1] == "consistent_hash"
    assert argv[argv.index("--worker-urls") + 1 :][:2] == ["http://a:1", "http://b:2"]
    argv = router_argv("127.0.0.1", 9000, [], ["--policy", "round_robin"])
    assert argv.count("--policy") == 1 and argv[-1] == "round_robin"


# -- weights -----------------------------------------------------------------------------


def test_buckets_respect_the_byte_limit_and_keep_order() -> None:
    tensors = [(f"w{i}", torch.zeros(256)) for i in range(5)]  # 1 KiB each
    buckets = list(bucket_tensors(tensors, bucket_bytes=2048))
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    big = list(bucket_tensors([("big", torch.zeros(4096)), ("s", torch.zeros(1))], 1024))
    assert [[n for n, _ in b] for b in big] == [["big"], ["s"]]


def test_written_weights_round_trip_and_duplicates_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.bfloat16)
    folder = write_weights([[("a", a)], [("b", b)]], tmp_path / "v1")
    files = sorted(folder.glob("*.safetensors"))
    assert [f.name for f in files] == ["bucket-00000.safetensors", "bucket-00001.safetensors"]
    assert torch.equal(load_file(str(files[0]))["a"], a)
    assert load_file(str(files[1]))["b"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'a' appears twice"):
        write_weights([[("a", a)], [("a", a)]], tmp_path / "dup")
    assert not (tmp_path / "dup").exists() and not (tmp_path / "dup.partial").exists()


def test_a_folder_written_again_is_rewritten_in_place_or_replaced(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    def write(scale: float, shapes=((2, 3), (5,)), **kw) -> dict[str, int]:
        buckets = [[(f"w{i}", torch.full(s, scale)), ("n", torch.arange(3))] if i == 0 else
                   [(f"w{i}", torch.full(s, scale))] for i, s in enumerate(shapes)]  # fmt: skip
        folder = write_weights(buckets, tmp_path / "slot", dtype="bfloat16", **kw)
        return {p.name: p.stat().st_ino for p in sorted(folder.iterdir())}

    first = write(1.0)
    assert write(2.0) == first  # the same files, overwritten
    loaded = {
        k: v for f in sorted((tmp_path / "slot").iterdir()) for k, v in load_file(str(f)).items()
    }
    assert torch.equal(loaded["w0"], torch.full((2, 3), 2.0, dtype=torch.bfloat16))
    assert torch.equal(loaded["w1"], torch.full((5,), 2.0, dtype=torch.bfloat16))
    assert torch.equal(loaded["n"], torch.arange(3))  # integers are never cast
    # A shape that changed replaces its file; a bucket fewer drops the last file.
    third = write(3.0, shapes=((2, 4),))
    assert list(third) == ["bucket-00000.safetensors"] and third != first
    assert torch.equal(
        load_file(str(tmp_path / "slot" / "bucket-00000.safetensors"))["w0"],
        torch.full((2, 4), 3.0, dtype=torch.bfloat16),
    )
    # What a killed first write left behind does not stop the next one.
    (tmp_path / "fresh.partial").mkdir()
    (tmp_path / "fresh.partial" / "bucket-00007.safetensors").write_bytes(b"half")
    folder = write_weights([[("w0", torch.ones(2))]], tmp_path / "fresh")
    assert [p.name for p in folder.iterdir()] == ["bucket-00000.safetensors"]
    # A rewrite that fails half-way leaves no folder to be trusted.
    with pytest.raises(ValueError, match="appears twice"):
        write_weights([[("w0", torch.ones(2, 4))], [("w0", torch.ones(1))]], tmp_path / "slot")
    assert not (tmp_path / "slot").exists()


def test_a_rewritten_file_stays_mapped_until_it_changes_or_its_folder_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    from vime.inference import weight_files
    from vime.inference.weights import remove_weights

    maps = []
    real = weight_files.mmap.mmap
    monkeypatch.setattr(weight_files.mmap, "mmap", lambda *a: maps.append(a) or real(*a))

    def write(value: float) -> torch.Tensor:
        folder = write_weights([[("w", torch.full((3, 4), value))]], tmp_path / "slot")
        return load_file(str(folder / "bucket-00000.safetensors"))["w"]

    assert torch.equal(write(1.0), torch.full((3, 4), 1.0))  # new: written, then unmapped
    assert torch.equal(write(2.0), torch.full((3, 4), 2.0))  # in place: mapped and kept
    assert len(maps) == 2 and len(weight_files._MAPPED) == 1
    for value in (3.0, 4.0):
        assert torch.equal(write(value), torch.full((3, 4), value))
    assert len(maps) == 2  # the kept map took both rewrites
    # Someone else replaced the file (a new inode): it is mapped anew, not written blind.
    path = tmp_path / "slot" / "bucket-00000.safetensors"
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    assert torch.equal(write(5.0), torch.full((3, 4), 5.0))
    assert len(maps) == 3
    monkeypatch.chdir(tmp_path)
    remove_weights("slot")  # however the folder is spelt
    assert weight_files._MAPPED == {} and not (tmp_path / "slot").exists()


def test_weights_written_in_the_engines_dtype_equal_the_engines_own_cast(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    master = torch.randn(64, 33, dtype=torch.float32) * 3
    steps = torch.arange(5, dtype=torch.int64)  # not floating point: never cast
    folder = write_weights([[("w", master), ("steps", steps)]], tmp_path / "v1", dtype="bfloat16")
    loaded = load_file(str(next(folder.glob("*.safetensors"))))
    assert loaded["w"].dtype == torch.bfloat16 and loaded["steps"].dtype == torch.int64
    # What vLLM's loader does with an fp32 tensor: copy_ into its bf16 parameter.
    engine_param = torch.empty(64, 33, dtype=torch.bfloat16).copy_(master)
    assert torch.equal(loaded["w"], engine_param)
    assert loaded["w"].element_size() == 2  # half the bytes of the fp32 master


def test_the_engines_dtype_comes_from_dtype_or_the_models_config(tmp_path: Path) -> None:
    from vime.inference.weights import engine_dtype

    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert engine_dtype(["--dtype", "bfloat16", "--enforce-eager"], tmp_path) == "bfloat16"
    assert engine_dtype(["--dtype=half"], tmp_path) == "float16"
    assert engine_dtype(["--dtype", "float32"], tmp_path) == "float32"
    assert engine_dtype([], tmp_path) == "bfloat16"  # auto: vLLM keeps a bf16 config
    assert engine_dtype(["--dtype", "auto"], tmp_path) == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert engine_dtype([], tmp_path) is None  # vLLM's choice for fp32 configs: not ours
    assert engine_dtype([], tmp_path / "missing") is None


class FakeEngines:
    """Records the HTTP calls a weight update makes; can fail one step on one engine."""

    def __init__(self, fail: tuple[str, str] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def handler(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.calls.append((host, path))
        if self.fail == (host, path):
            return httpx.Response(500, json={"error": "boom"})
        if path == "/pause":
            assert request.url.params["mode"] in ("wait", "abort")
        if path == "/collective_rpc":
            body = json.loads(request.content)
            assert body["method"] == "vime_load_weights"
            return httpx.Response(200, json={"results": [{"tensors": 3, "bytes": 96}]})
        if path == "/update_weight_version":
            assert json.loads(request.content) == {"new_version": "7"}
        return httpx.Response(200, json={})


async def test_weight_update_pauses_all_then_loads_then_versions_then_resumes(
    tmp_path: Path,
) -> None:
    fake = FakeEngines()
    updater = WeightUpdater(mode="abort", transport=httpx.MockTransport(fake.handler))
    report = await updater.update(["http://e0:1", "http://e1:1"], str(tmp_path), 7)
    phases = [path for _, path in fake.calls]
    assert phases == ["/pause"] * 2 + ["/collective_rpc"] * 2 + (
        ["/update_weight_version"] * 2 + ["/resume"] * 2
    )
    assert {h for h, _ in fake.calls} == {"e0", "e1"}
    assert (report.version, report.tensors_loaded, report.bytes_loaded) == (7, 3, 96)


async def test_a_failed_load_still_resumes_every_engine_and_names_the_step(
    tmp_path: Path,
) -> None:
    fake = FakeEngines(fail=("e1", "/collective_rpc"))
    updater = WeightUpdater(transport=httpx.MockTransport(fake.handler))
    with pytest.raises(InferenceError, match=r"load weights on http://e1:1 answered 500"):
        await updater.update(["http://e0:1", "http://e1:1"], str(tmp_path), 7)
    assert sorted(h for h, p in fake.calls if p == "/resume") == ["e0", "e1"]
    assert ("e0", "/update_weight_version") not in fake.calls


async def test_weight_update_refuses_a_missing_folder_or_no_engine(tmp_path: Path) -> None:
    updater = WeightUpdater(transport=httpx.MockTransport(FakeEngines().handler))
    with pytest.raises(InferenceError, match="is not a folder"):
        await updater.update(["http://e0:1"], str(tmp_path / "nope"), 1)
    with pytest.raises(InferenceError, match="no healthy engine"):
        await updater.update([], str(tmp_path), 1)
    with pytest.raises(ValueError, match="'wait' or 'abort'"):
        WeightUpdater(mode="keep")  # type: ignore[arg-type]


# -- client ------------------------------------------------------------------------------
