"""Pipeline parallelism on CPU (gloo, megatron-core through the shim): PP=2, and PP=2 with
TP=2, give one process's logprobs, loss, gradients, weights after a step and export; a
checkpoint saved across pipeline stages resumes the same step."""

from __future__ import annotations

import pytest
import torch

from vime.training.megatron.pipeline import stage_layers, to_global_layer, to_local_layer

TOKENS = [[5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33], [4, 81, 23, 7, 7, 56, 90], [12, 6, 48, 30, 71]]
PP2 = ["--pipeline-model-parallel-size", "2"]
TP2 = ["--tensor-model-parallel-size", "2"]


def test_layer_names_map_between_stage_and_model():
    name = "decoder.layers.1.self_attention.linear_qkv.weight"
    assert to_global_layer(name, 4) == "decoder.layers.5.self_attention.linear_qkv.weight"
    assert to_local_layer(to_global_layer(name, 4), 4) == name
    assert to_global_layer("module.decoder.layers.0.mlp.linear_fc1.weight", 2) == (
        "module.decoder.layers.2.mlp.linear_fc1.weight"
    )
    # Weights outside the decoder layers keep their names.
    for other in ("embedding.word_embeddings.weight", "decoder.final_layernorm.weight"):
        assert to_global_layer(other, 3) == other == to_local_layer(other, 3)
    with pytest.raises(ValueError, match="stage before"):
        to_local_layer("decoder.layers.1.input_layernorm.weight", 2)


def test_stage_layers_split_evenly():
    assert [list(stage_layers(6, 3, r)) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert list(stage_layers(4, 1, 0)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="evenly"):
        stage_layers(5, 2, 0)


def _run(folder, args, nproc):
    from pipeline_cpu import run_step

    from vime.training.launch import spawn

    return spawn(run_step, nproc, str(folder), args, TOKENS, backend="gloo", timeout=400)


@pytest.fixture(scope="module")
def pp_runs(tiny_models) -> dict[str, tuple[dict, list[dict]]]:
    """Per case: one process, and the same work pipelined (all ranks)."""
    pytest.importorskip("megatron.core")
    cases = {"llama-pp2": ("llama", PP2, 2), "qwen2-pp2": ("qwen2", PP2, 2)}
    cases["qwen3-pp2-tp2"] = ("qwen3", PP2 + TP2, 4)
    runs = {}
    singles: dict[str, dict] = {}
    for case, (family, args, nproc) in cases.items():
        if family not in singles:
            singles[family] = _run(tiny_models[family], [], 1)[0]
        runs[case] = (singles[family], _run(tiny_models[family], args, nproc))
    return runs


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(
        (torch.tensor(x) - torch.tensor(y)).abs().max().item() for x, y in zip(a, b, strict=True)
    )


def _assert_adam_close(single: dict, r: dict, rank: int) -> None:
    """Weights after the step equal one process's up to what Adam makes of the gradients' last
    bits (see test_parallel_cpu.test_tensor_parallel_step_equals_one_process)."""
    lr, eps, clip = 1e-3, 1e-8, 1.0
    scale = min(1.0, clip / (single["metrics"]["grad_norm"] + 1e-6))
    assert sorted(r["weights"]) == sorted(single["weights"])
    for name, w in r["weights"].items():
        g = single["grads"][name] * scale
        dg = (r["grads"][name] - single["grads"][name]).abs() * scale
        bound = torch.clamp(2 * lr * eps * dg / (g.abs() + eps) ** 2, max=2 * lr) + 1e-6
        excess = (w - single["weights"][name]).abs() - bound
        assert excess.max().item() <= 0, f"rank {rank}: weight {name} off by {excess.max():.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama-pp2", "qwen2-pp2", "qwen3-pp2-tp2"])
def test_pipeline_step_equals_one_process(pp_runs, case):
    single, ranks = pp_runs[case]
    for rank, r in enumerate(ranks):
        assert _max_diff(r["before"], single["before"]) < 1e-5
        assert _max_diff(r["step_logprobs"], single["step_logprobs"]) < 1e-5
        assert _max_diff(r["after"], single["after"]) < 1e-5
        assert r["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-6)
        # The clipping norm counts every parameter once (the tied embedding's two copies too).
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-6)
        assert r["metrics"]["policy/num_tokens"] == single["metrics"]["policy/num_tokens"]
        # Every parameter's full gradient as the optimizer gets it; a tied embedding's copies
        # on the first and last stage agree (checked while gathering).
        assert sorted(r["grads"]) == sorted(single["grads"])
        for name, grad in single["grads"].items():
            diff = (r["grads"][name] - grad).abs().max().item()
            assert diff < 1e-6, f"rank {rank}: gradient of {name} off by {diff:.3g}"
        _assert_adam_close(single, r, rank)
    # Rank 0 receives every stage's full HF tensors; the others none.
    assert all(r["exported"] == {} for r in ranks[1:])
    assert sorted(ranks[0]["exported"]) == sorted(single["exported"])
    for name, tensor in single["exported"].items():
        assert torch.equal(ranks[0]["exported"][name], tensor), name


@pytest.mark.slow
def test_checkpoint_resumes_across_stages(tiny_models, tmp_path):
    pytest.importorskip("megatron.core")
    from pipeline_cpu import run_resume

    from vime.training.launch import spawn

    folder, ckpt_dir = str(tiny_models["qwen2"]), str(tmp_path / "ckpt")
    ranks = spawn(run_resume, 2, folder, PP2, TOKENS, ckpt_dir, backend="gloo", timeout=400)
    for r in ranks:
        assert r["version"] == 1
        # The resumed second step is the uninterrupted one: same loss, norm and weights.
        for key in ("loss", "grad_norm"):
            assert r["second"][key] == r["first"][key], key
    assert sorted(ranks[0]["second_export"]) == sorted(ranks[0]["first_export"])
    for name, tensor in ranks[0]["first_export"].items():
        assert torch.equal(ranks[0]["second_export"][name], tensor), name


@pytest.mark.slow
def test_pipeline_refusals(tiny_models):
    pytest.importorskip("megatron.core")
    from vime.errors import ConfigError
    from vime.training.base import TrainerConfig
    from vime.training.megatron.trainer import MegatronTrainer

    def build(family: str, pp: str) -> None:
        config = TrainerConfig(hf_checkpoint=str(tiny_models[family]), backend="megatron")
        MegatronTrainer(config, megatron_args=["--pipeline-model-parallel-size", pp])

    with pytest.raises(ConfigError, match="mixture-of-experts"):
        build("qwen3_moe", "2")
    with pytest.raises(ConfigError, match="must divide the model's 2 layers"):
        build("qwen2", "3")
