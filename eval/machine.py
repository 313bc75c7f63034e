"""Where epiforge runs: the repository's paths, and the one fingerprint of the machine and
the sources that every result file, Result and session log records."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata as md
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from epiforge import ROOT as REPO  # the one root: the checkout, or the installed package

HUMAN_DIR = REPO / "human_kernels"
GENERATED_DIR = REPO / "generated_kernels"
DATA_DIR = REPO / "eval" / "data"
STATE_DIR = REPO / ".epiforge"  # git-ignored: the results store, caches


def data_dir() -> Path:
    """The per-user data directory, where agent sessions write by default (sessions/ for the
    logs, kernels/ for passing kernels, workspaces/, replays/, ablations/):
    $EPIFORGE_DATA_DIR, else $XDG_DATA_HOME/epiforge, else ~/.local/share/epiforge. Read at
    each call, so that the environment of the moment decides; nothing is created here."""
    if os.environ.get("EPIFORGE_DATA_DIR"):
        return Path(os.environ["EPIFORGE_DATA_DIR"]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else Path.home() / ".local" / "share"
    return base / "epiforge"


def hopper_problem() -> str | None:
    """Why the fused kernels cannot run on a GPU of this machine, in one line, or None: they
    need a Hopper (sm_90) GPU that torch sees. Imports torch (about a second)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU here"
        major, minor = torch.cuda.get_device_capability()
        if major != 9:
            return f"the GPU here is {torch.cuda.get_device_name()} (sm_{major}{minor}); the fused kernels need sm_90"
    except Exception as e:  # noqa: BLE001 - a broken CUDA setup is an answer too: no GPU to run on
        first = str(e).splitlines()[0] if str(e) else ""
        return f"torch cannot use the GPU: {type(e).__name__}" + (f": {first}" if first else "")
    return None


@functools.lru_cache(maxsize=1)
def hopper_available() -> bool:
    """A Hopper GPU the quack kernels can run on (hopper_problem finds none in the way); asked
    once per process."""
    return hopper_problem() is None


def expert_kernel(task_name: str) -> Path | None:
    """The task's expert kernel, human_kernels/<task name>.py, or None: a task may have none
    (its expert track is then empty)."""
    path = HUMAN_DIR / f"{task_name}.py"
    return path if path.is_file() else None


PACKAGES = ("nvidia-cutlass-dsl", "quack-kernels", "triton", "liger-kernel", "flashinfer-python")


def source_commit(where: Path | None = None) -> str | None:
    """The git commit the sources came from (+ "-dirty" with uncommitted changes), or
    $EPIFORGE_COMMIT where the caller set it: a machine that received a copy of the working
    tree may hold no .git, or a stale one, so the caller's word wins."""
    if os.environ.get("EPIFORGE_COMMIT"):
        return os.environ["EPIFORGE_COMMIT"]
    where = where or REPO
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20, check=False,
                             cwd=where)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=20, check=False, cwd=where).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def name_output_folder(command: str) -> str:
    """The device's output folder ($OUT) by its name, not its path: each whole path
    component equal to it (at the start, or after a space, "=" or a quote; followed by "/", a
    space, a quote or the end) becomes $OUT."""
    out = (os.environ.get("OUT") or "").rstrip("/")
    if len(out) < 2:
        return command
    return re.sub(r"(?<![^\s='\"])" + re.escape(out) + r"(?=/|\s|['\"]|$)", "$OUT", command)


def command_line(module: str, argv: list[str] | None) -> str:
    """How to rerun this: `python -m <module> <args>` (module: its full name), with the output
    folder as $OUT and no machine path; the command a result file's fingerprint records."""
    out = os.environ.get("OUT")
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m", module, *((a.replace(out, "$OUT") if out else a) for a in args)])


def fingerprint(device: str | None = None, command: str | None = None, *, commit: bool = True) -> dict:
    """Versions of this machine (never a path or a name): Python, torch, CUDA, the pinned
    packages, and with device "cuda" the GPU, its driver and capability; the date; the
    command that made a result; the sources' commit."""
    import torch

    env = {"python": platform.python_version(), "machine": platform.machine(), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    for pkg in PACKAGES:
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    env["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if command is not None:
        env["command"] = name_output_folder(command)
    if commit:
        env["commit"] = source_commit()
    return env
