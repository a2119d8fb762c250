from vime.hardware import cpu_flags, cpu_has_native_bf16

# Abridged /proc/cpuinfo of an AVX2-only AMD EPYC (Zen 1) and of a Xeon with AMX.
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx f16c fma avx2 sha_ni
"""
XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
XEON_AVX512_ONLY = "flags\t: avx2 avx512f avx512bw avx512vl avx512_vnni\n"


def test_native_bf16_is_avx512_bf16_or_amx_and_nothing_else(tmp_path) -> None:
    for name, text, native in [
        ("epyc", EPYC, False),
        ("xeon", XEON, True),
        ("avx512", XEON_AVX512_ONLY, False),
        ("amx_only", "flags : avx2 amx_bf16\n", True),
    ]:
        path = tmp_path / name
        path.write_text(text)
        assert cpu_has_native_bf16(path) is native, name
    assert "avx2" in cpu_flags(tmp_path / "epyc")


def test_an_unreadable_cpuinfo_means_no_native_bf16(tmp_path) -> None:
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_has_native_bf16(tmp_path / "missing") is False
    (tmp_path / "noflags").write_text("processor : 0\n")
    assert cpu_has_native_bf16(tmp_path / "noflags") is False
