"""Fast specs of the inference layer: config, command lines, weight-update sequencing, client
retries and error mapping, all against fakes (the real engines are in the slow tests)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from vime.cli.main import parse_args
from vime.config.schema import build
from vime.errors import ConfigError
from vime.inference.client import SamplingParams, VimeClient
from vime.inference.config import ServeConfig
from vime.inference.engines import engine_argv, engine_env, served_model_name
from vime.inference.errors import ContextTooLong, InferenceError, RequestAborted
from vime.inference.router import router_argv
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
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
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


def _chat_body(finish_reason: str = "stop") -> dict:
    return {
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [{
            "index": 0, "finish_reason": finish_reason, "token_ids": [7, 8],
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": {"content": [
                {"token": "h", "logprob": -0.5, "bytes": [104], "top_logprobs": []},
                {"token": "i", "logprob": -1.5, "bytes": [105], "top_logprobs": []},
            ]},
        }],
    }  # fmt: skip


async def test_chat_returns_ids_logprobs_version_and_sends_the_session_header() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_chat_body(), headers={"x-vime-weight-version": "4"})

    client = VimeClient("http://r/v1", model="m", transport=httpx.MockTransport(handler))
    result = await client.chat([{"role": "user", "content": "x"}], session_id="s-1")
    assert (result.prompt_ids, result.completion_ids, result.logprobs) == (
        [1, 2, 3], [7, 8], [-0.5, -1.5],
    )  # fmt: skip
    assert (result.text, result.finish_reason, result.weight_version) == ("hi", "stop", 4)
    assert result.message == {"role": "assistant", "content": "hi"}
    assert seen[0].headers["x-session-id"] == "s-1"
    body = json.loads(seen[0].content)
    assert body["return_token_ids"] is True and body["logprobs"] is True


async def test_refused_connections_are_retried_then_succeed() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=_chat_body())

    client = VimeClient(
        "http://r/v1", model="m", retry_backoff=0.0, transport=httpx.MockTransport(handler)
    )
    result = await client.chat([{"role": "user", "content": "x"}])
    assert attempts == 3 and result.completion_ids == [7, 8] and result.weight_version is None


async def test_a_request_that_was_accepted_and_failed_is_not_retried() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.RemoteProtocolError("server disconnected", request=request)

    client = VimeClient(
        "http://r/v1", model="m", retry_backoff=0.0, transport=httpx.MockTransport(handler)
    )
    with pytest.raises(RequestAborted) as info:
        await client.chat([{"role": "user", "content": "x"}])
    assert attempts == 1 and info.value.reason == "connection_lost"


@pytest.mark.parametrize(
    ("status", "body", "error", "reason"),
    [
        (400, {"error": {"message": "This model's maximum context length is 64 tokens."}},
         ContextTooLong, None),
        (500, {"error": {"message": "EngineCore died"}}, RequestAborted, "server_error"),
        (404, {"error": {"message": "model nope not found"}}, InferenceError, None),
    ],
)  # fmt: skip
async def test_http_errors_become_typed_errors(
    status: int, body: dict, error: type, reason: str | None
) -> None:
    client = VimeClient(
        "http://r/v1",
        model="m",
        transport=httpx.MockTransport(lambda r: httpx.Response(status, json=body)),
    )
    with pytest.raises(error) as info:
        await client.chat([{"role": "user", "content": "x"}])
    assert body["error"]["message"] in str(info.value)
    if reason:
        assert info.value.reason == reason


async def test_an_engine_abort_is_reported_as_an_aborted_request() -> None:
    client = VimeClient(
        "http://r/v1",
        model="m",
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=_chat_body("abort"))),
    )
    with pytest.raises(RequestAborted) as info:
        await client.chat([{"role": "user", "content": "x"}])
    assert info.value.reason == "aborted_by_engine"


async def test_generate_reads_vllm_weight_version_spans() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/inference/v1/generate"
        assert json.loads(request.content)["token_ids"] == [1, 2]
        return httpx.Response(
            200,
            json={"choices": [{
                "index": 0, "text": "ab", "finish_reason": "length", "token_ids": [5, 6],
                "logprobs": {"content": [{"token": "a", "logprob": -1.0, "bytes": [97]},
                                         {"token": "b", "logprob": -2.0, "bytes": [98]}]},
                "weight_versions": [{"version": "3", "start": 0, "end": 2}],
            }]},
        )  # fmt: skip

    client = VimeClient("http://r/v1", model="m", transport=httpx.MockTransport(handler))
    result = await client.generate([1, 2], sampling={"max_tokens": 2})
    assert (result.completion_ids, result.logprobs, result.text) == ([5, 6], [-1.0, -2.0], "ab")
    assert result.weight_version == 3 and result.weight_versions == [(3, 0, 2)]


def test_sampling_params_reject_unknown_options() -> None:
    assert SamplingParams.of({"temperature": 0.0}).temperature == 0.0
    with pytest.raises(InferenceError, match=r"unknown sampling option\(s\) \['temprature'\]"):
        SamplingParams.of({"temprature": 0.0})
