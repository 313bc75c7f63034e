"""The task catalogue: one folder per task under tasks/ (and under each folder named in
$EPIFORGE_TASKS_PATH), each a task.toml and a reference.py. How to write one:
tasks/AUTHORING.md. The ten CODA kernels k0-k9 are CODA_TASKS."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from epiforge.tasks.spec import (
    ENV_TASKS_PATH,
    TASK_API,
    TASKS_DIR,
    ShapeSet,
    Task,
    TaskCodeError,
    TaskError,
    load_shape_sets,
    load_task_file,
    task_dirs,
    task_order,
)

#: the CODA paper's ten kernels (arXiv 2605.19269): the track the shipped H200 results cover
CODA_TASKS = ("k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9")


def spec_files() -> list[Path]:
    """Every task.toml of every task folder, in the order of task_dirs()."""
    return [p for d in task_dirs() for p in sorted(Path(d).glob("*/task.toml"))]


def load_catalogue() -> tuple[list[Task], list[str]]:
    """Every task that loads, sorted by id, plus one error line per malformed spec (a broken
    spec never hides the others; of two tasks with one id or name, the later is refused)."""
    tasks, errors = [], []
    for path in spec_files():
        try:
            task = load_task_file(path)
        except TaskError as e:
            errors.append(str(e))
            continue
        clash = next((t for t in tasks if task.id in (t.id, t.name) or task.name in (t.id, t.name)), None)
        if clash is not None:
            errors.append(f"{path}: id: {task.id!r} / name {task.name!r} is already taken by {clash.folder / 'task.toml'}")
            continue
        tasks.append(task)
    tasks.sort(key=lambda t: task_order(t.id))
    return tasks, errors


def get_task(name: str) -> Task:
    """A task by full name (k0_gemm_residual_partial_rmsnorm) or id (k0)."""
    return _get_task(name, task_dirs())


@lru_cache(maxsize=None)
def _get_task(name: str, dirs: tuple[Path, ...]) -> Task:
    for path in spec_files():
        if path.parent.name == name:
            return load_task_file(path)  # its own spec error, if it has one
    catalogue, errors = load_catalogue()
    for task in catalogue:
        if name in (task.id, task.name):
            return task
    known = ", ".join(t.id for t in catalogue)
    broken = f" ({len(errors)} malformed spec(s) skipped: see `epiforge tasks list`)" if errors else ""
    raise TaskError(f"unknown task {name!r}; known: {known}{broken}")


def task_arg(arg: str) -> str:
    """A --task value as the catalogue names it. An id or name stays as it is; a path to a
    task folder anywhere (it has a "/", or is "." or "..": `--task ./my_task`, `--task ~/tasks/x1_gemm_bias`)
    puts the folder's parent on $EPIFORGE_TASKS_PATH, for this process and the judges and
    runners it starts, and gives the folder's name. TaskError (one line) for a path that is
    no task folder, a folder that does not load, or one whose id or name another task
    folder has already."""
    if "/" not in arg and os.sep not in arg and arg not in (".", ".."):
        return arg
    try:
        folder = Path(arg).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # ~nosuchuser, a symlink loop
        raise TaskError(f"{arg}: not a task folder ({e})") from None
    if not (folder / "task.toml").is_file():
        raise TaskError(f"{arg}: not a task folder (no task.toml in {folder})")
    task = load_task_file(folder / "task.toml")  # its own error, one line
    dirs = [p for p in os.environ.get(ENV_TASKS_PATH, "").split(os.pathsep) if p]
    known = {TASKS_DIR.resolve(), *(Path(p).expanduser().resolve() for p in dirs)}
    if folder.parent not in known:
        os.environ[ENV_TASKS_PATH] = os.pathsep.join([*dirs, str(folder.parent)])
    clash = next((t for t in load_catalogue()[0] if t.folder.resolve() != folder
                  and {t.id, t.name} & {task.id, task.name}), None)
    if clash is not None:
        raise TaskError(f"{arg}: id {task.id!r} / name {task.name!r} is already taken by the task in {clash.folder}: "
                        "give this folder another id and name (in task.toml, and the folder's own name)")
    return task.name


def id_of(name: str) -> str:
    """A task's id from its name (the name itself for a task not in the catalogue)."""
    return _ids(task_dirs()).get(name, name)


@lru_cache(maxsize=None)
def _ids(dirs: tuple[Path, ...]) -> dict[str, str]:
    return {t.name: t.id for t in load_catalogue()[0]}


@lru_cache(maxsize=None)
def shape_sets() -> dict[str, list[ShapeSet]]:
    return load_shape_sets()


__all__ = ["CODA_TASKS", "ENV_TASKS_PATH", "ShapeSet", "Task", "TaskCodeError", "TaskError", "get_task", "id_of",
           "load_catalogue", "shape_sets", "spec_files", "task_dirs", "task_order"]
