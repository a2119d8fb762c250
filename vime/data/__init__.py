"""Task data: dataset rows that envs receive as ``reset(options={"task": row})``."""

from vime.data.tasks import TaskFileError, draw_tasks, load_tasks, validate_task

__all__ = ["TaskFileError", "draw_tasks", "load_tasks", "validate_task"]
