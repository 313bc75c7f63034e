"""The task catalogue: the ten CODA kernels k0-k9 (see tasks/<name>/task.toml)."""

from __future__ import annotations

from functools import lru_cache

from tasks.spec import TASKS_DIR, ShapeSet, Task, TaskError, load_shape_sets, load_task_file


def load_catalogue() -> tuple[list[Task], list[str]]:
    """Every task that loads, sorted by id, plus one error line per malformed spec
    (a broken spec never hides the others)."""
    tasks, errors = [], []
    for path in sorted(TASKS_DIR.glob("*/task.toml")):
        try:
            tasks.append(load_task_file(path))
        except TaskError as e:
            errors.append(str(e))
    tasks.sort(key=lambda t: int(t.id[1:]))
    return tasks, errors


@lru_cache(maxsize=None)
def get_task(name: str) -> Task:
    """A task by full name (k0_gemm_residual_partial_rmsnorm) or id (k0)."""
    for path in sorted(TASKS_DIR.glob("*/task.toml")):
        folder = path.parent.name
        if folder == name or folder.split("_", 1)[0] == name:
            return load_task_file(path)
    known = ", ".join(sorted(p.parent.name for p in TASKS_DIR.glob("*/task.toml")))
    raise TaskError(f"unknown task {name!r}; known: {known}")


@lru_cache(maxsize=None)
def shape_sets() -> dict[str, list[ShapeSet]]:
    return load_shape_sets()


__all__ = ["Task", "TaskError", "ShapeSet", "get_task", "load_catalogue", "shape_sets"]
