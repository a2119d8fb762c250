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
    fused = spawn(step_with_counts, 1, args[0], FUSED, *args[1:], backend="gloo")[0]
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
    assert base["fused_calls"] == {}, base["fused_calls"]
    for a, b in zip(fused["before"], base["before"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-6, rtol=0)
    assert fused["metrics"]["loss"] == pytest.approx(base["metrics"]["loss"], abs=1e-6)
    assert base["grads"].keys() == fused["grads"].keys()
    for name, g in base["grads"].items():
        assert g.abs().max() > 0, name
        assert torch.allclose(fused["grads"][name], g, atol=5e-6, rtol=1e-5), name
