"""Package layout: envs/, agents/ and sandboxes/ are top-level folders that import as
vime.envs, vime.agents and vime.sandboxes (never as top-level `agents` or `envs`,
which would shadow the OpenAI Agents SDK)."""

from setuptools import find_packages, setup

ROOTS = {
    "vime": "vime",
    "vime.envs": "envs",
    "vime.agents": "agents",
    "vime.sandboxes": "sandboxes",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
