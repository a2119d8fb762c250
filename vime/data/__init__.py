"""Task data: dataset rows that envs receive as ``reset(options={"task": row})``."""

from vime.data.tasks import TaskFileError, load_tasks, validate_task

__all__ = ["TaskFileError", "load_tasks", "validate_task"]
