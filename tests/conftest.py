"""Suite-wide collection rules: tests marked ``docker`` need a Docker engine and the sandbox image
(``$VIME_SANDBOX_IMAGE``, default ``vime-sandbox:bookworm``; ``.ci/docker_setup.sh`` builds it).
Without either they skip with the reason, except where ``VIME_REQUIRE_DOCKER=1`` (CI) makes that
an error instead, so a run can never pass by leaving them out."""

from __future__ import annotations

import os

import pytest


def docker_unusable() -> str | None:
    """Why the docker-marked tests cannot run here, or None when the engine and image are there."""
    from vime.sandboxes import docker as docker_backend

    error = docker_backend.engine_error()
    if error is not None:
        return error
    import docker

    image = os.environ.get("VIME_SANDBOX_IMAGE", docker_backend.DEFAULT_IMAGE)
    try:
        docker_backend.api().inspect_image(image)
    except docker.errors.ImageNotFound:
        return f"the sandbox image {image!r} is missing; {docker_backend.IMAGE_HINT}"
    return None


@pytest.hookimpl(trylast=True)  # after ``-m`` deselection: only selected tests ask for Docker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needing = [item for item in items if item.get_closest_marker("docker")]
    if not needing:
        return
    error = docker_unusable()
    if error is None:
        return
    if os.environ.get("VIME_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError(
            f"{len(needing)} selected tests need Docker and VIME_REQUIRE_DOCKER=1, but {error}"
        )
    skip = pytest.mark.skip(reason=f"needs Docker: {error}")
    for item in needing:
        item.add_marker(skip)
