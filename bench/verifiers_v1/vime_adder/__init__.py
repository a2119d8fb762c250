"""The rollout benchmark's add-tool task as a ``verifiers`` 0.4 (``verifiers.v1``) taskset, for
``bench/_verifiers_v1_driver.py``; imported only in the verifiers venv, never by Vime."""

from vime_adder.taskset import AdderTaskset

__all__ = ["AdderTaskset"]
