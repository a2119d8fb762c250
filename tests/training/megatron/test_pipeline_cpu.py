"""Pipeline parallelism on CPU (gloo, megatron-core through the shim): PP=2, PP=2 with TP=2 and
PP=2 with DP=2 run the 1F1B schedule and give one process's logprobs, loss, gradients, weights
after a step and export; a checkpoint saved across pipeline stages resumes the same step."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from vime.training.megatron.pipeline import (
    one_f_one_b,
    stage_layers,
    to_global_layer,
    to_local_layer,
)

# One sequence per micro-batch where they fit (budget 11 tokens): 4 micro-batches in one
# process, the last packing two sequences; under DP=2, 3 per rank, one of them a dummy.
TOKENS = [
    [5, 9, 14, 3, 77, 41, 8, 60, 2, 19, 33],
    [4, 81, 23, 7, 7, 56, 90],
    [12, 6, 48, 30, 71],
    [3, 17, 29, 64, 88, 11, 50, 42, 9],
    [70, 2, 36, 15, 93, 27],
]
PP2 = ["--pipeline-model-parallel-size", "2"]
TP2 = ["--tensor-model-parallel-size", "2"]
CASES = {  # model family, Megatron flags, processes
    "llama-pp2": ("llama", PP2, 2),
    "qwen2-pp2": ("qwen2", PP2, 2),
    "qwen3-pp2-tp2": ("qwen3", PP2 + TP2, 4),
    "qwen2-pp2-dp2": ("qwen2", PP2, 4),
}


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


def test_1f1b_order():
    fb = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert one_f_one_b(2, 0, 4) == fb
    assert one_f_one_b(2, 1, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    # Fewer micro-batches than warm-up forwards: all forwards, then all backwards.
    assert one_f_one_b(4, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert one_f_one_b(3, 2, 0) == []


@pytest.mark.parametrize(("stages", "micro_batches"), [(2, 1), (2, 5), (3, 2), (4, 7)])
def test_1f1b_runs_to_the_end_with_bounded_activations(stages, micro_batches):
    """Every stage runs each pass once, a stage keeps at most ``stages - rank`` forwards awaiting
    their backward, and the stages never all wait: sends don't block, a forward waits for the
    previous stage's forward of that micro-batch, a backward for the next stage's backward."""
    orders = [one_f_one_b(stages, r, micro_batches) for r in range(stages)]
    for rank, order in enumerate(orders):
        everything = [(k, i) for k in "FB" for i in range(micro_batches)]
        assert sorted(order) == sorted(everything)
        in_flight = 0
        for kind, _ in order:
            in_flight += 1 if kind == "F" else -1
            assert 0 <= in_flight <= stages - rank
    done: set[tuple[int, str, int]] = set()
    position = [0] * stages
    while any(p < len(o) for p, o in zip(position, orders, strict=True)):
        progressed = False
        for rank, order in enumerate(orders):
            if position[rank] == len(order):
                continue
            kind, i = order[position[rank]]
            needs = (rank - 1, "F", i) if kind == "F" else (rank + 1, "B", i)
            if needs[0] in (-1, stages) or needs in done:
                done.add((rank, kind, i))
                position[rank] += 1
                progressed = True
        assert progressed, f"deadlock with every stage waiting at {position}"


def _run(folder, args, nproc):
    from pipeline_cpu import run_step

    from vime.training.launch import spawn

    return spawn(run_step, nproc, str(folder), args, TOKENS, backend="gloo", timeout=400)


@pytest.fixture(scope="module")
def pp_run(tiny_models) -> Callable[[str], tuple[dict, list[dict]]]:
    """A case's one-process run and the same work pipelined (all ranks), run when a test first
    asks (each test then takes its own share of the time); one-process runs are shared."""
    pytest.importorskip("megatron.core")
    singles: dict[str, dict] = {}
    runs: dict[str, tuple[dict, list[dict]]] = {}

    def run(case: str) -> tuple[dict, list[dict]]:
        if case not in runs:
            family, args, nproc = CASES[case]
            if family not in singles:
                singles[family] = _run(tiny_models[family], [], 1)[0]
            runs[case] = (singles[family], _run(tiny_models[family], args, nproc))
        return runs[case]

    return run


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(
        (torch.tensor(x) - torch.tensor(y)).abs().max().item() for x, y in zip(a, b, strict=True)
    )


def _assert_adam_close(single: dict, r: dict, rank: int) -> float:
    """Weights after the step equal one process's up to what Adam makes of the gradients' last
    bits (see test_parallel_cpu.test_tensor_parallel_step_equals_one_process); returns the
    largest difference."""
    lr, eps, clip = 1e-3, 1e-8, 1.0
    scale = min(1.0, clip / (single["metrics"]["grad_norm"] + 1e-6))
    assert sorted(r["weights"]) == sorted(single["weights"])
    for name, w in r["weights"].items():
        g = single["grads"][name] * scale
        dg = (r["grads"][name] - single["grads"][name]).abs() * scale
        bound = torch.clamp(2 * lr * eps * dg / (g.abs() + eps) ** 2, max=2 * lr) + 1e-6
        excess = (w - single["weights"][name]).abs() - bound
        assert excess.max().item() <= 0, f"rank {rank}: weight {name} off by {excess.max():.3g}"
    return max((w - single["weights"][n]).abs().max().item() for n, w in r["weights"].items())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_pipeline_step_equals_one_process(pp_run, case, record_property):
    single, ranks = pp_run(case)
    grad_diff = 0.0
    for rank, r in enumerate(ranks):
        # Each stage ran its micro-batches in the 1F1B order (traced as autograd reached them).
        size, pp_rank = r["stage"]
        assert size == 2 and len(r["trace"]) >= 6
        assert r["trace"] == one_f_one_b(size, pp_rank, len(r["trace"]) // 2)
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
            grad_diff = max(grad_diff, diff)
        record_property(f"rank{rank}_weight_max_diff", _assert_adam_close(single, r, rank))
        for key in ("before", "step_logprobs", "after"):
            record_property(f"rank{rank}_{key}_max_diff", _max_diff(r[key], single[key]))
        record_property(f"rank{rank}_loss", (r["metrics"]["loss"], single["metrics"]["loss"]))
    record_property("grad_max_diff", grad_diff)
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
