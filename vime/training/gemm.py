"""Weight-gradient GEMMs that add straight into an fp32 buffer.

A bf16 weight gradient written as its own tensor and then added to an fp32 accumulator costs a
temporary and a second pass over it; a GEMM with ``beta=1`` into the fp32 buffer does both at
once. Megatron's linears (``--gradient-accumulation-fusion``) and the chunked output layer
(vime.training.output_logprobs) use it.
"""

from __future__ import annotations

import torch


def wgrad_gemm_accum_fp32(
    total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
) -> None:
    """``main_grad += grad_outputᵀ · total_input`` with fp32 accumulation, in place.

    ``total_input`` is ``[tokens, in]``, ``grad_output`` ``[tokens, out]``, ``main_grad``
    ``[out, in]`` fp32 (or float64 with float64 inputs).
    """
    if total_input.dtype == main_grad.dtype:
        main_grad.addmm_(grad_output.t(), total_input)
    elif main_grad.is_cuda:
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32, out=main_grad)
    else:  # no mixed-precision GEMM on this device: product in the input dtype, then the add
        main_grad.add_(grad_output.t() @ total_input)


def wgrad_gemm_fp32(total_input: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """A new fp32 ``grad_outputᵀ · total_input``: the first term of a sum that
    :func:`wgrad_gemm_accum_fp32` continues, with nothing zeroed or read for it. CUDA forms it
    in fp32 from bf16/fp16 inputs; elsewhere the product is formed in the inputs' dtype and
    cast, as :func:`wgrad_gemm_accum_fp32` adds it there."""
    if total_input.is_cuda and total_input.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(grad_output.t(), total_input, out_dtype=torch.float32)
    return (grad_output.t() @ total_input).float()
