"""The Triton kernels of vime.training.kernels equal the unfused math: forward values and
gradients in fp32 against float64 (and bf16 against torch's own kernel). They run on the CPU
under Triton's interpreter, in a child process because the interpreter is chosen when a kernel
is first defined."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

HELPER = Path(__file__).with_name("kernels_interpreted.py")


def _interpreted(check: str) -> dict[str, float]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(HELPER), check], capture_output=True, text=True, env=env, timeout=600
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
    for key, value in d.items():
        if "fp32" in key:
            assert value < 2e-5, (key, value)
        else:
            # fp32 math cast once to bf16. Triton's interpreter casts by truncation (1 + 2^-8 +
            # 2^-10 becomes 1.0, not 1.0078125; CUDA rounds to nearest): one bf16 step, 2^-7.
            assert value <= 2**-7 * 1.01, (key, value)


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
