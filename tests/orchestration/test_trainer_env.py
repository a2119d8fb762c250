"""The environment CPU trainer ranks start with: tcmalloc preloaded when the system has it."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import pytest

from vime.orchestration.cluster import trainer_env_vars


def test_cpu_trainer_ranks_preload_tcmalloc_unless_an_allocator_is_preloaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = {"tcmalloc_minimal": "libtcmalloc_minimal.so.4"}
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: found.get(name))
    assert trainer_env_vars(gpu=False, base={}) == {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}
    assert trainer_env_vars(gpu=False, base={"LD_PRELOAD": "/x/libfoo.so"}) == {
        "LD_PRELOAD": "libtcmalloc_minimal.so.4:/x/libfoo.so"
    }
    # The user's allocator stands, GPU ranks are left alone, and without tcmalloc nothing changes.
    assert trainer_env_vars(gpu=False, base={"LD_PRELOAD": "/opt/libjemalloc.so.2"}) == {}
    assert trainer_env_vars(gpu=True, base={}) == {}
    found.clear()
    assert trainer_env_vars(gpu=False, base={}) == {}


def _mapped_libraries() -> str:
    return Path("/proc/self/maps").read_text()


@pytest.mark.slow
def test_a_ray_actor_started_with_the_trainer_env_runs_on_tcmalloc() -> None:
    env = trainer_env_vars(gpu=False, base={})
    if not env:
        pytest.skip("libtcmalloc_minimal is not installed (Debian: libtcmalloc-minimal4)")
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        probe = ray.remote(_mapped_libraries)
        with_env = probe.options(num_cpus=0, runtime_env={"env_vars": env}).remote()
        assert "libtcmalloc" in ray.get(with_env, timeout=120)
        if "LD_PRELOAD" not in os.environ:  # the control: Ray's default workers use glibc's
            assert "libtcmalloc" not in ray.get(probe.options(num_cpus=0).remote(), timeout=120)
    finally:
        ray.shutdown()
