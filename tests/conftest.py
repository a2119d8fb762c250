"""Suite-wide collection rules: tests that need a Docker engine skip with the reason when none
answers, except where ``VIME_REQUIRE_DOCKER=1`` (CI) makes that an error instead."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(trylast=True)  # after ``-m`` deselection: only selected tests ask for Docker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needing = [item for item in items if item.get_closest_marker("docker")]
    if not needing:
        return
    from vime.sandboxes import docker as docker_backend

    error = docker_backend.engine_error()
    if error is None:
        return
    if os.environ.get("VIME_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError(
            f"{len(needing)} selected tests need Docker and VIME_REQUIRE_DOCKER=1, but {error}"
        )
    skip = pytest.mark.skip(reason=f"needs a Docker engine: {error}")
    for item in needing:
        item.add_marker(skip)
