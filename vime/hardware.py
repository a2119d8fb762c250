"""What this machine's processor computes natively, and the allocator CPU work runs with, for
the choices that depend on them."""

from __future__ import annotations

from pathlib import Path

# CPU flags (Linux /proc/cpuinfo names) of a native bf16 matmul: AVX-512 BF16 or AMX.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags of the first processor in ``cpuinfo``; empty where it cannot be read
    (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether the CPU multiplies bf16 matrices in hardware. Without it torch and vLLM emulate
    bf16 and run far slower than fp32 (a quickstart train step: about 600 s against 5 s)."""
    return bool(cpu_flags(cpuinfo) & NATIVE_BF16_FLAGS)


def preload_tcmalloc(env: dict[str, str]) -> None:
    """Preload tcmalloc into the process ``env`` starts, when the system has it (Debian:
    ``libtcmalloc-minimal4``) and ``LD_PRELOAD`` names no allocator already (the user's
    jemalloc or mimalloc stands). For CPU engines and CPU trainers: glibc's malloc hands the
    pages of large freed blocks back to the kernel and faults them in again at the next step's
    allocations. On the 2-core dev box it raised SmolLM2's decode rate 133-142 -> 155-160
    tokens/s, cut a weight update 0.48 -> 0.37 s, and a quickstart train step 6.4-7.5 ->
    5.8-6.3 s (docs/performance.md)."""
    import ctypes.util

    preload = env.get("LD_PRELOAD", "")
    if "malloc" in preload:
        return
    lib = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    if lib:
        env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
