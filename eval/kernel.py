"""Kernel: one Python file that solves one task. Its metadata is read from the source's
top-level constants without importing it (generated code is untrusted).

A kernel module defines:
    TASK = "<task name>"                 (required)
    AUTHOR = "..."                       (expert kernels: who wrote it; read under human_kernels/ only)
    prepare(consts) -> dict              (optional; reads only the task's constant inputs)
    run(inputs, prepared, config=None) -> dict[str, Tensor]

Provenance is the harness's record, never the kernel's word: a generated kernel's session,
backend and model come from the Origin record that `generate` writes beside it
(<session>.origin.json), and only while that record's hash is the file's. The SESSION,
BACKEND and MODEL lines `generate` stamps into the file are for a reader; constants a kernel
writes itself are its own text and reach no Result.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from epiforge.eval.static_checks import SourceTooComplex, parse_bounded

from epiforge.eval.machine import GENERATED_DIR, HUMAN_DIR, REPO, data_dir, expert_kernel  # noqa: F401 (re-exported)


class KernelError(ValueError):
    """A kernel file that cannot be used (one clear line)."""


class Kernel(BaseModel):
    path: Path
    task: str
    track: str  # expert | generated | candidate
    sha256: str
    author: str | None = None
    session: str | None = None
    backend: str | None = None
    model: str | None = None
    has_prepare: bool = False


def read_kernel(path: Path, track: str | None = None, source: str | None = None) -> Kernel:
    """Parse a kernel file's metadata (never imports it); `source`: its text, when already
    read (the evaluator reads a file once, so what it checks is what runs)."""
    path = Path(path)
    if source is None:
        try:
            source = path.read_text()
        except OSError as e:
            raise KernelError(f"{path}: cannot read: {e.strerror}") from None
    try:
        tree = parse_bounded(source, str(path))
    except SyntaxError as e:
        raise KernelError(f"{path}{f':{e.lineno}' if e.lineno else ''}: syntax error: {e.msg}") from None
    except SourceTooComplex as e:
        raise KernelError(f"{path}: {e}") from None
    consts, funcs = {}, set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                consts[node.targets[0].id] = node.value.value
        elif isinstance(node, ast.FunctionDef):
            funcs.add(node.name)
    if "TASK" not in consts:
        raise KernelError(f"{path}: no TASK = \"<task name>\" constant at the top level")
    if "run" not in funcs:
        raise KernelError(f"{path}: no top-level def run(inputs, prepared, config=None)")
    if track is None:
        resolved = path.resolve()
        generated = any(resolved.is_relative_to(d.resolve()) for d in generated_roots())
        track = "expert" if resolved.is_relative_to(HUMAN_DIR) else "generated" if generated else "candidate"
    sha256 = hashlib.sha256(source.encode()).hexdigest()
    author = consts.get("AUTHOR") if path.resolve().is_relative_to(HUMAN_DIR) else None  # the repository's own file
    origin = read_origin(path, sha256)
    return Kernel(path=path, task=consts["TASK"], track=track, sha256=sha256, author=author,
                  session=origin and origin.session, backend=origin and origin.backend, model=origin and origin.model,
                  has_prepare="prepare" in funcs)


class Origin(BaseModel):
    """Where a saved kernel came from, as the harness that saved it recorded it."""

    session: str
    """The session's ID (its log is <session>.jsonl)."""
    backend: str
    """The model backend the session drove (anthropic, openai, command, replay, ...)."""
    model: str
    """The model's name as the session was configured with it."""
    kernel_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The SHA-256 of the kernel file's text: the record holds for that text only."""


def origin_path(kernel: Path) -> Path:
    """The record beside a saved kernel: <task>/<name>.py -> <task>/<name>.origin.json."""
    return Path(kernel).with_suffix(".origin.json")


def write_origin(kernel: Path, origin: Origin) -> Path:
    """Record where the kernel at `kernel` came from (the harness only: `generate`, when it
    saves a passing kernel)."""
    path = origin_path(kernel)
    path.write_text(origin.model_dump_json(indent=1) + "\n", encoding="utf-8")
    return path


def read_origin(kernel: Path, sha256: str) -> Origin | None:
    """The record beside `kernel` if there is one and it is for this text (sha256), else None:
    an edited kernel, or one dropped beside another's record, has no provenance."""
    try:
        raw = origin_path(kernel).read_text(encoding="utf-8")[:10_000]
        origin = Origin.model_validate(json.loads(raw))
    except (OSError, ValueError, ValidationError):
        return None
    return origin if origin.kernel_sha256 == sha256 else None


#: the module name every kernel is loaded under. quack keys compiled kernels by the
#: epilogue function's module and name, so the evaluator worker, lab/bench/ and the
#: precompile step must all load kernels under this same name to share compiled objects
KERNEL_MODULE_NAME = "candidate_kernel"


def load_kernel_module(path: Path):
    """Import a kernel file as a fresh module (NOT for the harness process: only inside
    an evaluation worker, or for trusted expert kernels in lab/bench/). Its bytes are read as
    UTF-8 text, as the harness read them for the static checks, and that text is what
    runs: compiled as a str, whose PEP 263 declaration Python ignores, never re-decoded
    by one (eval/static_checks.py coding_declaration)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(KERNEL_MODULE_NAME, str(path))
    module = importlib.util.module_from_spec(spec)
    text = Path(path).read_bytes().decode(errors="replace")
    exec(compile(text, str(path), "exec", dont_inherit=True), module.__dict__)
    return module


def generated_roots() -> tuple[Path, Path]:
    """Where generated kernels live: the repository's committed track (generated_kernels/)
    and the user's own, the data directory's kernels/ (where `generate` puts a passing
    kernel by default). Both hold <task name>/<session ID>.py."""
    return GENERATED_DIR, data_dir() / "kernels"


def generated_kernels(task_name: str) -> list[Path]:
    """Every generated kernel of a task, the committed track first, then the user's; an ID
    found in both is the committed one (a kernel copied there with --out)."""
    seen, out = set(), []
    for root in generated_roots():
        folder = root / task_name
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            if path.stem not in seen:
                seen.add(path.stem)
                out.append(path)
    return out


def resolve_kernel(spec: str, task_name: str) -> Path:
    """'human' (or 'expert', compare's name for the track) -> the expert kernel of the task;
    'generated:ID' -> <task>/<ID>.py in the committed track or the user's data directory
    (generated_roots); anything else is a path."""
    if spec in ("human", "expert"):
        path = expert_kernel(task_name)
        if path is None:
            raise KernelError(f"{task_name} has no expert kernel (no {HUMAN_DIR.name}/{task_name}.py): "
                              "its expert track is empty")
    elif spec.startswith("generated:"):
        want = spec.split(":", 1)[1]
        path = next((p for p in generated_kernels(task_name) if p.stem == want), None)
        if path is None:
            roots = " or ".join(str(r / task_name) for r in generated_roots())
            raise KernelError(f"no generated kernel {want} of {task_name} (looked in {roots})")
    else:
        path = Path(spec)
    if not path.is_file():
        raise KernelError(f"no kernel file at {path}")
    return path
