"""The Triton kernels of vime.training.kernels equal the unfused math: forward values and
gradients in fp32 against float64 (and bf16 against torch's own kernel). They run on the CPU
under Triton's interpreter, in a child process because the interpreter is chosen when a kernel
is first defined."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

HELPER = Path(__file__).with_name("kernels_interpreted.py")


def _interpreted(check: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(HELPER), check, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rms_norm_kernels_equal_the_unfused_math():
    d = _interpreted("rms_norm_cases")
    assert d.pop("launches") == 9  # every case above went through the Triton kernels
    for key, value in d.items():
        if key.endswith("bfloat16_y") or key.endswith("bfloat16_dx"):
            # Both round once to bf16 from fp32 math; they may land one bf16 step apart.
            assert value <= 0.0625, (key, value)
        elif key.endswith("bfloat16_dw_rel"):
            assert value < 1e-2, (key, value)
        elif key.endswith("_dw_rel"):
            assert value < 1e-5, (key, value)
        else:
            assert value < 2e-5, (key, value)


def test_rope_kernel_equals_the_unfused_math():
    d = _interpreted("rope_cases")
    for key, value in d.items():
        if key.endswith("_changed"):
            assert value > 0.5, key  # the rotation moved the values
        else:
            assert value < 2e-6, (key, value)


def test_swiglu_kernels_equal_the_unfused_math():
    d = _interpreted("swiglu_cases")
    assert {k for k in d if k.startswith("pair_")} == {
        f"pair_{t}_{x}" for t in ("fp32", "bf16") for x in ("out", "grad_a", "grad_b")
    }
    assert d.pop("gated_launched") == 1.0  # forward and backward through the kernel
    assert {"gated_fp32_out", "gated_fp32_grad"} <= set(d)
    for key, value in d.items():
        if "fp32" in key:
            assert value < 2e-5, (key, value)
        else:
            # fp32 math cast once to bf16. Triton's interpreter casts by truncation (1 + 2^-8 +
            # 2^-10 becomes 1.0, not 1.0078125; CUDA rounds to nearest): one bf16 step, 2^-7.
            assert value <= 2**-7 * 1.01, (key, value)


def test_adamw_kernel_equals_decoupled_weight_decay_adam():
    d = _interpreted("adamw_cases")
    assert d.pop("launches") == 3 + 1  # one launch per step for all four tensors, one unaligned
    # Own allocations start on 16 bytes (vector loads on CUDA); views one element into a
    # buffer do not, and take the scalar path.
    assert d.pop("aligned") == 1.0 and d.pop("unaligned_taken") == 1.0
    assert d.pop("block_tables_kept") == 1.0  # new gradients each step: only pointers rebuilt
    for key, value in d.items():
        if key.endswith("_moved"):
            assert value > 0.02, key  # lr 0.01 for three steps: every tensor moved
        elif key.endswith("_model_bf16_rel"):
            assert value <= 2**-7 * 1.01, (key, value)  # one bf16 step (truncation)
        elif key.endswith("_torch_p"):
            assert value < 1e-6, (key, value)  # torch.optim.AdamW's own fp32 result
        else:
            assert value < 1e-6, (key, value)  # relative to the tensor's scale, vs float64


def test_adamw_kernel_compiles_for_the_h200_with_vector_loads():
    """The kernel as CUDA compiles it for sm_90 (Triton's own ptxas, no GPU needed): the
    aligned variant moves whole blocks with 16-byte vector loads and stores, the other
    compiles too. The interpreter alone accepts code CUDA refuses (it did, once, here)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vime.training.kernels.adamw import BLOCK, _adamw_kernel

    ints = {"pointers": "*i64", "n": "i32", "sizes": "*i64", "block_tensor": "*i32",
            "block_start": "*i64", "scale_ptr": "*fp32"}  # fmt: skip
    floats = ("lr", "weight_decay", "beta1", "beta2", "eps", "bc1", "bc2_sqrt", "grad_scale")
    consts = ("WRITE_MODEL", "MODEL_DTYPE", "ALIGNED", "SCALE_IN_MEMORY", "BLOCK")
    signature = {**ints, **dict.fromkeys(floats, "fp32"), **dict.fromkeys(consts, "constexpr")}
    vectors = {}
    for aligned in (True, False):
        for write_model, dtype in ((True, 0), (True, 1), (False, 0)):
            # the clip factor read from memory in the bf16 case, a float argument elsewhere
            in_memory = write_model and dtype == 0
            constants = {"WRITE_MODEL": write_model, "MODEL_DTYPE": dtype, "ALIGNED": aligned,
                         "SCALE_IN_MEMORY": in_memory, "BLOCK": BLOCK}  # fmt: skip
            src = ASTSource(fn=_adamw_kernel, signature=signature, constexprs=constants)
            compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
            assert compiled.asm["cubin"]
            ptx = compiled.asm["ptx"]
            vectors[(aligned, write_model, dtype)] = ptx.count(".v4.")
            if write_model:  # the copy rounds to nearest even, as torch's copy_ does
                narrow = re.findall(r"cvt\.[a-z.]*(?:bf16|f16)[a-z0-9]*\.f32", ptx)
                assert narrow and all(c.startswith("cvt.rn.") for c in narrow), set(narrow)
    assert all(vectors[(True, *rest)] >= 16 for rest in ((True, 0), (True, 1), (False, 0)))
    assert all(vectors[(False, *rest)] == 0 for rest in ((True, 0), (True, 1), (False, 0)))


def test_the_torch_backends_fused_optimizer_steps_like_torchs_clip_and_adamw(tmp_path):
    """--hf-optimizer-fusion from `vime train` to the torch trainer (interpreted): the same
    losses, gradient norms, float32 weights and AdamW states as clip_grad_norm_ plus torch's
    AdamW, with clipping and weight decay active, one launch per parameter group and step; on
    the bf16 weight copy the kernel also writes the copy, which then needs no refresh."""
    d = _interpreted("torch_optimizer_fusion_cases", str(tmp_path))
    for kind, steps in (("copy", 1), ("float32", 3)):
        assert d[f"{kind}_launches"] == 2 * steps and d[f"{kind}_unfused_launches"] == 0, d
        assert d[f"{kind}_min_grad_norm"] > 1.0, d  # --clip-grad 0.05 scaled every step
        assert d[f"{kind}_moved"] > 1e-3, d  # every weight took its steps
        assert d[f"{kind}_same_states"] == 1.0 and d[f"{kind}_steps"] == 0.0, d
        assert d[f"{kind}_loss"] < 1e-6 and d[f"{kind}_grad_norm_rel"] < 1e-6, d
        assert d[f"{kind}_weights"] < 1e-6, d  # fp32 rounding order
        assert d[f"{kind}_exp_avg"] < 1e-5 and d[f"{kind}_exp_avg_sq"] < 1e-5, d
    assert d["copy_vs_masters"] == 0.0 and d["copy_stale"] == 0.0, d
    assert d["unfused_copy_stale"] == 1.0, d  # the unfused step leaves the refresh to the copy


def test_the_torch_backend_steps_torchs_adamw_where_triton_does_not_run(untied_qwen3):
    """On the CPU (no interpreter) --hf-optimizer-fusion leaves torch's fused AdamW in charge,
    and the norm it returns is a float as before."""
    from trainer_data import config, make_batch

    from vime.training.torch_backend import TorchTrainer

    trainer = TorchTrainer(config(untied_qwen3))
    assert trainer.config.hf_optimizer_fusion and not trainer._fused_optimizer
    metrics = trainer.train_step(make_batch(0))
    assert metrics["grad_norm"] > 0 and not hasattr(trainer.optimizer, "_vime_steps")


def test_output_softmax_kernels_equal_the_unfused_math():
    d = _interpreted("output_softmax_cases")
    # Every chunk of every fused call ran the kernels, forward: 6 cases x 5 chunks of 8 rows,
    # 8 chunks of 5, 10 of 4, 2 (the scored rows), 4 (bf16); backward the same but the
    # scored-rows call, which takes no gradient.
    assert (d.pop("stats_calls"), d.pop("grad_calls")) == (54, 52)
    assert d.pop("rows_zero_elsewhere") == 0.0  # unscored rows stay exactly 0
    for key, value in d.items():
        if key.startswith("bf16") and key[-2:] in ("gh", "gw"):
            # The logits' gradient is rounded once to bf16 on both paths (the interpreter
            # truncates, torch rounds): they may land one bf16 step apart.
            assert value < 1e-2, (key, value)
        else:
            assert value < 2e-6, (key, value)  # relative to the largest value, vs float64


def test_the_output_softmax_flag_reaches_the_trainer(tiny_llama, tmp_path):
    d = _interpreted("output_softmax_flag_cases", str(tiny_llama), str(tmp_path))
    assert (d["on_config"], d["off_config"]) == (1.0, 0.0)
    assert d["on_calls"] >= 1 and d["off_calls"] == 0
    assert abs(d["on_loss"] - d["off_loss"]) < 1e-5, d


def test_hf_module_fusions_train_like_transformers_own_modules(tmp_path):
    d = _interpreted("hf_module_cases", str(tmp_path))
    # Per forward (the logprob pass and the train step's), every norm took the kernel: 2
    # layers x (input, post-attention) + the final one, and Qwen3's query/key norms; every
    # MLP (2 layers); every rotation.
    norms = {"llama": 5, "qwen2": 5, "qwen3": 9}
    for family, count in norms.items():
        assert d[f"{family}_off_calls"] == 0
        assert (d[f"{family}_norm_calls"], d[f"{family}_norm_other_calls"]) == (2 * count, 0)
        assert (d[f"{family}_mlp_calls"], d[f"{family}_mlp_other_calls"]) == (2 * 2, 0)
        # the query and the key of both layers
        assert (d[f"{family}_rope_calls"], d[f"{family}_rope_other_calls"]) == (2 * 4, 0)
        for name in ("norm", "mlp", "rope"):
            key = f"{family}_{name}"
            assert d[f"{key}_logprobs"] < 1e-5 and d[f"{key}_loss"] < 1e-6, (key, d)
            assert d[f"{key}_grad_norm_rel"] < 1e-5, (key, d)
            assert d[f"{key}_grads_rel"] < 2e-5, (key, d)  # every parameter's gradient


def test_the_bf16_weight_copy_runs_the_hf_kernels_like_a_bf16_model(tmp_path):
    d = _interpreted("weight_copy_kernel_cases", str(tmp_path))
    assert d["micro_batches"] == 2  # gradients accumulate over two micro-batches
    assert d["calls"] == d["replica_calls"] > 0, d  # the kernels ran on the bf16 copy
    assert d["same_names"] == 1.0 and d["grad_dtypes_fp32"] == 1.0, d
    assert d["loss"] == 0.0 and d["grads"] == 0.0, d


def test_the_hf_fusion_flags_reach_the_torch_trainers_modules(tiny_llama, tmp_path):
    from transformers.models.llama import modeling_llama

    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup
    from vime.training import hf_kernels
    from vime.training.torch_backend import TorchTrainer

    routed = {}
    flags = ([], ["--no-hf-rms-norm-fusion"], ["--no-hf-swiglu-fusion"], ["--no-hf-rope-fusion"])
    for extra in flags:
        argv = ["train", "--model", str(tiny_llama), "--env", "vime/Math-v0"]
        setup = build_setup(parse_args([*argv, "--output-dir", str(tmp_path), *extra]))
        model = TorchTrainer(setup.trainer, setup.loss).model
        kinds = ("LlamaRMSNorm", "LlamaMLP")
        routed[" ".join(extra)] = (
            *(
                sum(hasattr(m, "_vime_forward") for m in model.modules() if type(m).__name__ == k)
                for k in kinds
            ),
            hf_kernels._rope_on,
        )
    assert routed == {
        "": (5, 2, True),
        "--no-hf-rms-norm-fusion": (0, 2, True),
        "--no-hf-swiglu-fusion": (5, 0, True),
        "--no-hf-rope-fusion": (5, 2, False),
    }
    # transformers' attention calls its module's function: that is the one wrapped.
    assert hasattr(modeling_llama.apply_rotary_pos_emb, "vime_original")


def test_output_softmax_kernels_compile_for_the_h200_with_vector_loads():
    """Both kernels as CUDA compiles them for sm_90: whole vocab tiles of bf16 logits move
    with 16-byte vector loads (and stores, backward) when the rows start on 16 bytes (Qwen3's
    151,936-entry rows do)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vime.training.kernels.output_softmax import BLOCK, _backward_kernel, _forward_kernel

    head = {"logits": "*bf16", "row_stride": "i32", "targets": "*i64"}
    forward = {**head, "stats": "*fp32", "rows": "i32", "vocab": "i32", "vocab_start": "i32",
               "inv_temp": "fp32", "BLOCK": "constexpr"}  # fmt: skip
    backward = {**head, "lse": "*fp32", "entropy": "*fp32", "g_lp": "*fp32", "g_ent": "*fp32",
                "vocab": "i32", "vocab_start": "i32", "inv_temp": "fp32", "BLOCK": "constexpr"}  # fmt: skip
    aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    for fn, signature, stores in ((_forward_kernel, forward, 0), (_backward_kernel, backward, 2)):
        src = ASTSource(fn=fn, signature=signature, constexprs={"BLOCK": BLOCK}, attrs=aligned)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        assert ptx.count("ld.global.v4") >= 2, fn.__name__
        assert ptx.count("st.global.v4") >= stores, fn.__name__


@pytest.mark.parametrize("backward", [False, True])
def test_the_hf_module_kernels_compile_for_the_h200(backward):
    """The two-tensor SwiGLU and the table-driven RoPE kernels, as CUDA compiles them for
    sm_90 (the interpreter accepts code that CUDA refuses)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vime.training.kernels import rope, swiglu

    pair = {name: "*bf16" for name in ("A", "B", "G", "OUT", "DB")}
    pair.update(n="i64", BACKWARD="constexpr", BLOCK="constexpr")
    tables = {"T": "*bf16", "OUT": "*bf16", "COS": "*fp32", "SIN": "*fp32"}
    tables.update(dict.fromkeys(("stride_tok", "stride_head", "heads", "half"), "i32"))
    tables.update(BACKWARD="constexpr", BLOCK_H="constexpr", BLOCK_HALF="constexpr")
    cases = (
        (swiglu._pair_kernel(), pair, {"BACKWARD": backward, "BLOCK": 1024}),
        (rope._tables_kernel(), tables, {"BACKWARD": backward, "BLOCK_H": 32, "BLOCK_HALF": 64}),
    )
    for fn, signature, constants in cases:
        src = ASTSource(fn=fn, signature=signature, constexprs=constants)
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]


def test_qk_norm_rope_kernels_equal_the_unfused_math():
    d = _interpreted("qk_norm_rope_cases")
    # 3 shapes x (2 position kinds + the run without a value gradient) + the bf16 run
    assert (d.pop("forward"), d.pop("backward")) == (10, 10)
    for key, value in d.items():
        if key.endswith("_changed"):
            assert value > 1.0, key  # the norm and rotation moved the values
        elif key.startswith("bf16"):
            # The unfused kernels' composition in bf16 (rms_norm, then rope): the same roundings
            # in the same order; a different fp32 summation order may move one element by a
            # bf16 step (none did here: 0.0).
            assert value <= 2**-7, (key, value)
        elif key.endswith("_rel"):
            assert value < 1e-5, (key, value)  # a norm weight's gradient, over its scale
        else:
            assert value < 2e-6, (key, value)  # the value is a copy: exactly 0


def test_norm_weight_grads_go_to_megatrons_main_grad_only_when_marked():
    from vime.training.kernels import ACCUMULATE_MAIN_GRAD, norm_weight_grad

    partial = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.25, 2.0**-12]])
    sums = partial.sum(0)
    weight = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    got = norm_weight_grad(weight, partial)  # unmarked: the sums, in the weight's dtype
    assert got.dtype == torch.bfloat16 and torch.equal(got, sums.bfloat16())
    # Marked, with megatron's fp32 main_grad and its flag: added there in fp32 (the 2^-12 that
    # bf16 rounding would drop survives), flagged, and a placeholder handed to autograd.
    weight.main_grad = torch.full((3,), 10.0)
    weight.grad_added_to_main_grad = False
    setattr(weight, ACCUMULATE_MAIN_GRAD, True)
    placeholder = norm_weight_grad(weight, partial[:, :])
    assert torch.equal(weight.main_grad, 10.0 + sums) and weight.grad_added_to_main_grad
    assert placeholder.shape == weight.shape
    norm_weight_grad(weight, partial)  # a second micro-batch accumulates
    assert torch.equal(weight.main_grad, 10.0 + sums + sums)
    # A strided partial (the query/key kernel's [programs, 2, width] rows) sums the same.
    pair = torch.stack([partial, partial * 3], dim=1)
    weight.main_grad = torch.zeros(3)
    norm_weight_grad(weight, pair[:, 1])
    assert torch.allclose(weight.main_grad, sums * 3, rtol=1e-6, atol=0)
    weight.main_grad = torch.zeros(3, dtype=torch.bfloat16)  # not fp32: autograd's path
    weight.grad_added_to_main_grad = False
    assert torch.equal(norm_weight_grad(weight, partial), sums.bfloat16())
    assert not weight.grad_added_to_main_grad


def test_qk_norm_rope_refuses_shapes_it_cannot_split():
    from vime.training.kernels.qk_norm_rope import split_norm_rope

    angles, w = torch.zeros(8, 16), torch.ones(16)
    mixed = torch.zeros(4, 2, 64)  # 2 query heads + key + value of 16 per group
    with pytest.raises(ValueError, match="2 query heads, a key and a value of 16 is 64 wide"):
        split_norm_rope(mixed[..., :60], 2, w, w, 1e-6, angles, None)
    with pytest.raises(ValueError, match="both norm weights or neither"):
        split_norm_rope(mixed, 2, w, None, 1e-6, angles, None)
    with pytest.raises(ValueError, match="norm weight \\(8,\\) for heads of 16"):
        split_norm_rope(mixed, 2, w[:8], w[:8], 1e-6, angles, None)
    with pytest.raises(ValueError, match="head width 15 must be even"):
        split_norm_rope(torch.zeros(4, 2, 60), 2, None, None, 1e-6, torch.zeros(8, 15), None)


@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_kernels_compile_for_the_h200(norm):
    """Both kernels as CUDA compiles them for sm_90 (the interpreter accepts code that CUDA
    refuses), Qwen3-1.7B's per-rank shape: 16 query heads in 8 groups of 128."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vime.training.kernels import qk_norm_rope

    fwd, bwd = qk_norm_rope._kernels()
    consts = {"HAS_NORM": norm, "HAS_POSITIONS": True, "BLOCK_Q": 16, "BLOCK_G": 8,
              "BLOCK_HALF": 64}  # fmt: skip
    tail = {**dict.fromkeys(("groups", "per_group", "half"), "i32"), "eps": "fp32",
            **dict.fromkeys(consts, "constexpr")}  # fmt: skip
    weights = {"QW": "*bf16", "KW": "*bf16", "ANGLES": "*fp32", "POSITIONS": "*i64"}
    forward = {**dict.fromkeys(("MIXED", "Q", "K", "V"), "*bf16"), **weights,
               **dict.fromkeys(("stride_tok", "stride_group", "stride_angles"), "i32"), **tail}  # fmt: skip
    backward = {**dict.fromkeys(("DQ", "DK", "DV", "MIXED", "DMIXED"), "*bf16"), **weights,
                "DW_PARTIAL": "*fp32", "tokens": "i32", "per_program": "i32",
                **dict.fromkeys(("stride_dq", "stride_dq_head", "stride_dk", "stride_dk_head",
                                 "stride_dv", "stride_dv_head", "stride_tok", "stride_group",
                                 "stride_angles"), "i32"), **tail}  # fmt: skip
    for fn, signature in ((fwd, forward), (bwd, backward)):
        src = ASTSource(fn=fn, signature=signature, constexprs=consts)
        assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"], fn


def test_adamw_falls_back_to_the_same_math_and_refuses_bad_input():
    from vime.training.kernels.adamw import AdamWHyper, adamw_step

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs the kernels on the CPU")
    h = AdamWHyper(lr=0.1, weight_decay=0.5, beta1=0.9, beta2=0.99, eps=1e-8, step=1)
    p, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0])
    m, v, w = torch.zeros(2), torch.zeros(2), torch.empty(2, dtype=torch.bfloat16)
    adamw_step([p], [g], [m], [v], [w], h)
    # step 1: m_hat = g, v_hat = g^2, so the update is lr * sign(g) (0 where g is 0)
    expected = torch.tensor([1.0 * 0.95 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 * 0.95])
    assert torch.allclose(p, expected, atol=1e-6) and torch.equal(w, p.bfloat16())
    # a clip factor as a one-element tensor: the same math as the float
    p2, m2, v2 = torch.tensor([1.0, -2.0]), torch.zeros(2), torch.zeros(2)
    scaled = AdamWHyper(0.1, 0.5, 0.9, 0.99, 1e-8, step=1, grad_scale=torch.tensor([0.5]))
    adamw_step([p2], [g * 2], [m2], [v2], None, scaled)
    assert torch.allclose(p2, expected, atol=1e-6) and torch.allclose(m2, m)
    with pytest.raises(ValueError, match="grad_scale as a tensor must be one fp32 value"):
        adamw_step([p], [g], [m], [v], None, AdamWHyper(0.1, 0.0, 0.9, 0.99, 1e-8, step=2,
                   grad_scale=torch.tensor([0.5, 0.5])))  # fmt: skip
    with pytest.raises(ValueError, match="step counts from 1"):
        adamw_step([p], [g], [m], [v], None, AdamWHyper(0.1, 0.0, 0.9, 0.99, 1e-8, step=0))
    with pytest.raises(ValueError, match=r"grad 0 has shape \(3,\), its param \(2,\)"):
        adamw_step([p], [torch.zeros(3)], [m], [v], None, h)
    with pytest.raises(ValueError, match=r"exp_avg 0 is torch\.bfloat16"):
        adamw_step([p], [g], [m.bfloat16()], [v], None, h)
    with pytest.raises(ValueError, match="share one dtype"):
        adamw_step([p, p.clone()], [g, g], [m, m.clone()], [v, v.clone()],
                   [w, torch.empty(2)], h)  # fmt: skip


def test_kernels_fall_back_to_torch_off_cuda():
    """Without CUDA (and without the interpreter) the functions are torch's own math."""
    from vime.training.kernels import rms_norm, rope

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs the kernels on the CPU")
    x = torch.randn(4, 8)
    assert not rms_norm.available(x)
    assert not rope.available(x)
    w = torch.rand(8)
    y = rms_norm.rms_norm(x, w, 1e-6)
    assert torch.equal(y, torch.nn.functional.rms_norm(x, (8,), w, 1e-6))


def test_bad_shapes_are_refused_with_the_shapes_named():
    from vime.training.kernels import rms_norm, rope

    with pytest.raises(ValueError, match=r"weight of shape \(7,\) for rows of 8"):
        rms_norm.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="rotary width 5 must be even"):
        rope.rotate(torch.randn(2, 1, 8), torch.zeros(4, 5), None)
    with pytest.raises(ValueError, match=r"t \[tokens, heads, dim\]"):
        rope.rotate(torch.randn(2, 8), torch.zeros(4, 4), None)
