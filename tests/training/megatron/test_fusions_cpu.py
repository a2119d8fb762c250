"""Megatron's fused SwiGLU (--bias-swiglu-fusion: megatron-core's torch.compile'd functions,
Triton kernels on CUDA) equals the unfused MLP in fp32: the packed forward's logprobs and
entropy, and every parameter's gradient (max abs differences seen: 4.8e-7 and 1.1e-6; the
compiled kernel rounds differently). The MoE model's experts do not take the fused path in
megatron-core 0.16; it must still build and agree."""

from __future__ import annotations

import pytest
import torch
from megatron_cpu import grads_and_outputs

from vime.training.launch import spawn
from vime.training.megatron.model import host_bounds


@pytest.mark.slow
@pytest.mark.parametrize("triton", [False, True], ids=["compiled", "triton-interpreted"])
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_fused_swiglu_equals_the_unfused_mlp(tiny_models, family, triton, monkeypatch):
    """``triton``: the fused function's math runs in the Triton kernels it takes on CUDA (one
    forward and one backward launch per layer), by Triton's interpreter."""
    from fusions_cpu import grads_with_swiglu_launches

    if triton:
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # the spawned processes inherit it
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    folder = str(tiny_models[family])
    lp, ent, grads = spawn(grads_and_outputs, 1, folder, [], backend="gloo")[0]
    args = ["--bias-swiglu-fusion"]
    *fused, launches = spawn(grads_with_swiglu_launches, 1, folder, args, backend="gloo")[0]
    lp_f, ent_f, grads_f = fused
    # The dense model's 2 layers, forward and backward; megatron-core's MoE experts never
    # take the fused path.
    assert launches == (4 if triton and family == "qwen3" else 0)
    assert torch.allclose(lp_f, lp, atol=5e-6, rtol=0), (lp_f - lp).abs().max()
    assert torch.allclose(ent_f, ent, atol=5e-6, rtol=0), (ent_f - ent).abs().max()
    assert grads.keys() == grads_f.keys()
    mlp = [n for n in grads if "mlp" in n or "experts" in n]
    assert mlp and all(grads[n].abs().max() > 0 for n in mlp)  # the MLPs get gradient
    for name, g in grads.items():
        assert torch.allclose(grads_f[name], g, atol=5e-6, rtol=1e-5), name


def test_packed_attention_takes_the_bounds_from_the_host():
    class Params:
        cu_seqlens_q = torch.tensor([0, 3, 7])

    params = Params()
    assert host_bounds(params) == [0, 3, 7]
    params.cu_seqlens_q = None  # read once, then kept: a second layer does not read again
    assert host_bounds(params) == [0, 3, 7]


@pytest.mark.slow
def test_rope_and_wgrad_kernels_equal_megatron_unfused_code():
    from fusions_cpu import rope_and_wgrad_kernels

    diffs = spawn(rope_and_wgrad_kernels, 1, backend="gloo")[0]
    for case in ("bshd", "bshd_partial", "thd", "thd_offsets"):
        assert diffs[f"{case}_changed"] > 0.1, case
        assert diffs[f"{case}_out"] < 1e-6, (case, diffs)
        assert diffs[f"{case}_grad"] < 1e-6, (case, diffs)
    assert diffs["wgrad_fp32"] < 1e-5, diffs
    assert diffs["wgrad_bf16_inputs"] < 1e-5, diffs


FUSED = ["--apply-rope-fusion", "--gradient-accumulation-fusion", "--rms-norm-fusion"]
UNFUSED = ["--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-rms-norm-fusion"]
STEP_TOKENS = [list(range(3, 16)), list(range(40, 48)), list(range(60, 71))]


@pytest.mark.slow
@pytest.mark.parametrize("triton", [False, True], ids=["torch", "triton-interpreted"])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["packed", "per-sequence"])
def test_fused_step_like_unfused(tiny_models, per_sequence, triton, monkeypatch):
    """A whole train step with the RoPE, weight-gradient and RMSNorm fusions equals the
    unfused one in fp32: logprobs before the step, the loss and every parameter's accumulated
    gradient. Packed: one thd micro-batch of three sequences; per-sequence: three bshd
    micro-batches whose weight gradients accumulate in main_grad. ``triton``: RoPE and RMSNorm
    go through the Triton kernels they take on CUDA, run by Triton's interpreter."""
    from fusions_cpu import step_with_counts

    if triton:
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # the spawned processes inherit it
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    folder = str(tiny_models["qwen3"])
    args = (folder, STEP_TOKENS, per_sequence)
    base = spawn(step_with_counts, 1, args[0], UNFUSED, *args[1:], backend="gloo")[0]
    # The query/key norms and RoPE each on their own here; together below.
    separate = [*FUSED, "--no-qk-norm-rope-fusion"]
    fused = spawn(step_with_counts, 1, args[0], separate, *args[1:], backend="gloo")[0]
    calls = fused["fused_calls"]
    rope = "fused_apply_rotary_pos_emb" if per_sequence else "fused_apply_rotary_pos_emb_thd"
    layers = 2 * len(STEP_TOKENS) if per_sequence else 2
    assert calls.get(rope, 0) >= layers, calls  # query and key of every layer's forward
    assert calls.get("wgrad_gemm_accum_fp32", 0) > 0, calls
    # Triton: every norm (input, query, key, pre-MLP per layer, the final one) and every RoPE
    # call took the kernels; torch: none did (F.rms_norm and the compiled rotation).
    norms = (4 * 2 + 1) * (len(STEP_TOKENS) if per_sequence else 1)
    assert calls.get("triton_rms_norm", 0) == (norms * 2 if triton else 0), calls
    assert calls.get("triton_rope", 0) == (calls[rope] if triton else 0), calls
    # With --gradient-accumulation-fusion the kernels add every norm weight's gradient to
    # megatron's fp32 main_grad themselves (the step's backward: once per norm).
    assert calls.get("main_grad_norms", 0) == (norms if triton else 0), calls
    assert "autograd_norms" not in calls, calls
    assert base["fused_calls"] == {}, base["fused_calls"]
    for a, b in zip(fused["before"], base["before"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-6, rtol=0)
    assert fused["metrics"]["loss"] == pytest.approx(base["metrics"]["loss"], abs=1e-6)
    assert base["grads"].keys() == fused["grads"].keys()
    for name, g in base["grads"].items():
        assert g.abs().max() > 0, name
        assert torch.allclose(fused["grads"][name], g, atol=5e-6, rtol=1e-5), name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "per_sequence"),
    [("qwen3", False), ("qwen3", True), ("llama", False)],
    ids=["qwen3-packed", "qwen3-per-sequence", "llama-packed"],
)
def test_qk_norm_rope_fusion_steps_like_unfused(tiny_models, family, per_sequence, monkeypatch):
    """--qk-norm-rope-fusion (on by default beside the RMSNorm and RoPE fusions) equals the
    unfused step in fp32: logprobs before, the loss and every parameter's gradient (the
    query/key norm weights' included). Its kernel takes every layer's query, key
    and value (one launch per layer and micro-batch forward) where megatron's norms and RoPE
    took them; Llama has no query/key norms and takes the rotation alone."""
    from fusions_cpu import step_with_counts

    _interpreted(monkeypatch)
    folder = str(tiny_models[family])
    args = (folder, STEP_TOKENS, per_sequence)
    base = spawn(step_with_counts, 1, args[0], UNFUSED, *args[1:], backend="gloo")[0]
    fused = spawn(step_with_counts, 1, args[0], FUSED, *args[1:], backend="gloo")[0]
    calls = fused["fused_calls"]
    forwards = 2 * (len(STEP_TOKENS) if per_sequence else 1)  # the step's and the one after it
    assert calls.get("triton_qk_norm_rope", 0) == 2 * forwards, calls  # 2 layers
    assert "triton_rope" not in calls and "fused_apply_rotary_pos_emb_thd" not in calls, calls
    assert "fused_apply_rotary_pos_emb" not in calls, calls
    # Only the input, pre-MLP and final norms remain RMSNorm kernels.
    assert calls.get("triton_rms_norm", 0) == (2 * 2 + 1) * forwards, calls
    # Every norm weight's gradient (query/key ones from the fused kernel) went straight to
    # main_grad, once per norm in the step's backward.
    qk_weights = 2 * 2 if family == "qwen3" else 0
    assert calls.get("main_grad_norms", 0) == (5 + qk_weights) * forwards // 2, calls
    assert "autograd_norms" not in calls, calls
    for a, b in zip(fused["before"], base["before"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-6, rtol=0)
    assert fused["metrics"]["loss"] == pytest.approx(base["metrics"]["loss"], abs=1e-6)
    assert base["grads"].keys() == fused["grads"].keys()
    qk_norms = [n for n in base["grads"] if "q_layernorm" in n or "k_layernorm" in n]
    assert len(qk_norms) == (4 if family == "qwen3" else 0), qk_norms
    for name, g in base["grads"].items():
        assert g.abs().max() > 0, name
        assert torch.allclose(fused["grads"][name], g, atol=5e-6, rtol=1e-5), name


@pytest.mark.slow
def test_qk_norm_rope_fusion_launches_fewer_kernels(tiny_models, monkeypatch):
    """The point of --qk-norm-rope-fusion, counted over a train step: per layer and
    micro-batch, 6 fewer Triton launches (two norms and two rotations become one kernel,
    forward and backward) and fewer aten ops (the query's copy into head order, the norm
    weights' gradient sums, the assembly of the projection's gradient)."""
    from fusions_cpu import step_with_launch_counts

    _interpreted(monkeypatch)
    folder = str(tiny_models["qwen3"])
    args = (STEP_TOKENS, False)  # one packed micro-batch; the model has 2 layers
    fused = [*FUSED, "--bf16"]
    separate = spawn(step_with_launch_counts, 1, folder, [*fused, "--no-qk-norm-rope-fusion"],
                     *args, backend="gloo")[0]["launches"]  # fmt: skip
    joint = spawn(step_with_launch_counts, 1, folder, fused, *args, backend="gloo")[0]["launches"]
    assert separate["triton"] - joint["triton"] == 6 * 2, (separate, joint)
    assert separate["aten"] - joint["aten"] >= 2 * 2, (separate, joint)


def _interpreted(monkeypatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the spawned processes inherit it


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe"])
def test_fused_optimizer_steps_like_megatrons_own(tiny_models, monkeypatch, family):
    """--optimizer-fusion (clipping, AdamW, model copy in one Triton pass; interpreted here)
    against megatron-core's clip + torch AdamW, fp32, three steps with clipping active: every
    step's loss and gradient norm, the weights, and torch's AdamW states (moments, step). The
    MoE model's experts are parameters of their own."""
    from fusions_cpu import optimizer_run

    _interpreted(monkeypatch)
    folder = str(tiny_models[family])
    base = spawn(optimizer_run, 1, folder, ["--no-optimizer-fusion"], 3, backend="gloo")[0]
    fused = spawn(optimizer_run, 1, folder, ["--optimizer-fusion"], 3, backend="gloo")[0]
    assert (base["fused"], fused["fused"]) == (False, True)
    assert (base["launches"], fused["launches"]) == (0, 3 * 2)  # a step: decay, no-decay group
    # the fused step's norm and clip factor stay on the device: no host read before the update
    assert (base["host_norms"], fused["host_norms"]) == (3, 0)
    assert all(norm > 0.05 for _, norm in base["metrics"])  # clipping scaled every step
    for (loss, norm), (loss_f, norm_f) in zip(base["metrics"], fused["metrics"], strict=True):
        assert loss_f == pytest.approx(loss, abs=1e-6) and norm_f == pytest.approx(norm, rel=1e-5)
    for name, w in base["weights"].items():
        assert torch.allclose(fused["weights"][name], w, atol=2e-6, rtol=0), name
    assert len(base["states"]) == len(fused["states"]) > 0
    for s, s_f in zip(base["states"], fused["states"], strict=True):
        assert s.keys() == s_f.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert float(s_f["step"]) == float(s["step"]) == 3.0
        assert torch.allclose(s_f["exp_avg"], s["exp_avg"], atol=1e-7, rtol=1e-5)
        assert torch.allclose(s_f["exp_avg_sq"], s["exp_avg_sq"], atol=1e-9, rtol=1e-5)


@pytest.mark.slow
def test_fused_optimizer_under_tensor_parallelism_steps_like_megatrons_own(
    tiny_models, monkeypatch
):
    """TP=2 over gloo: each rank's shards step as megatron's own step does (the clipping uses
    the norm over both ranks, summed on the device)."""
    from fusions_cpu import optimizer_run

    _interpreted(monkeypatch)
    folder, tp = str(tiny_models["qwen3"]), ["--tensor-model-parallel-size", "2"]
    base = spawn(optimizer_run, 2, folder, ["--no-optimizer-fusion", *tp], 2, backend="gloo")
    fused = spawn(optimizer_run, 2, folder, ["--optimizer-fusion", *tp], 2, backend="gloo")
    for rank in range(2):
        assert fused[rank]["launches"] == 2 * 2 and fused[rank]["fused"]
        assert (base[rank]["host_norms"], fused[rank]["host_norms"]) == (2, 0)
        for (loss, norm), (loss_f, norm_f) in zip(
            base[rank]["metrics"], fused[rank]["metrics"], strict=True
        ):
            assert loss_f == pytest.approx(loss, abs=1e-6)
            assert norm_f == pytest.approx(norm, rel=1e-5) and norm > 0.05
        for name, w in base[rank]["weights"].items():
            assert torch.allclose(fused[rank]["weights"][name], w, atol=2e-6, rtol=0), name


@pytest.mark.slow
def test_fused_optimizer_writes_the_bf16_model_copy(tiny_models, monkeypatch):
    """--bf16: one step's fp32 masters match megatron's own step, and each bf16 model weight
    is its master rounded once (the interpreter truncates where CUDA rounds: one bf16 step)."""
    from fusions_cpu import optimizer_run

    _interpreted(monkeypatch)
    folder = str(tiny_models["qwen3"])
    args = ["--bf16"]
    base = spawn(optimizer_run, 1, folder, [*args, "--no-optimizer-fusion"], 1, backend="gloo")[0]
    fused = spawn(optimizer_run, 1, folder, [*args, "--optimizer-fusion"], 1, backend="gloo")[0]
    assert fused["launches"] == 2 and base["launches"] == 0
    assert fused["metrics"][0] == pytest.approx(base["metrics"][0], rel=1e-6)
    for m, m_f in zip(base["masters"], fused["masters"], strict=True):
        assert m_f.dtype == torch.float32 and torch.allclose(m_f, m, atol=2e-6, rtol=0)
    weights = list(fused["weights"].values())
    assert all(w.dtype == torch.bfloat16 for w in weights)
    by_shape = {}
    for m in fused["masters"]:
        by_shape.setdefault(tuple(m.shape), []).append(m)
    for name, w in fused["weights"].items():
        # the master this weight copies: the one whose rounding it is
        ok = any(
            ((w.double() - m.double()).abs() <= m.double().abs() * 2**-7 * 1.01).all()
            for m in by_shape[tuple(w.shape)]
        )
        assert ok, name


@pytest.mark.slow
def test_fused_optimizer_resumes_from_an_unfused_checkpoint(tiny_models, monkeypatch, tmp_path):
    """The fused step reads and writes torch's AdamW state: a checkpoint saved by megatron's
    own step after 1 of 3 steps, loaded by the fused step, continues like the unfused run (the
    bias corrections need the step count it read back)."""
    from fusions_cpu import optimizer_run

    _interpreted(monkeypatch)
    folder, ckpt = str(tiny_models["qwen3"]), str(tmp_path / "ckpt")
    unfused = ["--no-optimizer-fusion"]
    base = spawn(optimizer_run, 1, folder, unfused, 3, 1, ckpt, backend="gloo")[0]
    resumed = spawn(optimizer_run, 1, folder, ["--optimizer-fusion"], 2, 0, ckpt, backend="gloo")[0]
    assert resumed["launches"] == 2 * 2
    for (loss, norm), (loss_r, norm_r) in zip(base["metrics"][1:], resumed["metrics"], strict=True):
        assert loss_r == pytest.approx(loss, abs=1e-6) and norm_r == pytest.approx(norm, rel=1e-5)
    for name, w in base["weights"].items():
        assert torch.allclose(resumed["weights"][name], w, atol=2e-6, rtol=0), name
    assert all(float(s["step"]) == 3.0 for s in resumed["states"])
