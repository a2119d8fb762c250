"""Triton kernels of the trainers, each with a torch fallback and tests against the unfused
math (forward values and gradients in fp32)."""
