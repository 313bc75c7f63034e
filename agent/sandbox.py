"""The command backend's sandbox: the agent CLI runs where it sees its workspace (read-write),
the Python environment read-only, an empty home and /tmp of its own, and nothing else of the
repository, the home or the store: no expert kernel, no generated kernel, no test, no
session log, no measurement.

    python -m epiforge.agent.sandbox --workspace WS [--expose PATH ...] -- COMMAND [ARG ...]

What it does, in a child of the harness that then becomes COMMAND (exec):
  1. a user and a mount namespace of its own (unshare(2), unprivileged; the network stays,
     an agent CLI needs its model's API);
  2. clones of the trees that stay visible: the workspace, the Python environment
     (sys.prefix, the base interpreter, site-packages), in a checkout the package's own
     folders (PACKAGE_TREES), and what --expose names (the agent CLI's own install, when it
     lives under the home);
  3. the whole filesystem read-only, and an empty tmpfs over each hidden root: the
     repository (ROOT), the home ($HOME, /root, /home), /tmp and the store
     ($EPIFORGE_DATA_DIR);
  4. the clones put back at their own paths (read-only, the workspace read-write), and an
     empty read-only tmpfs over what the package holds but an agent must not read
     (SECRET_IN_PACKAGE: the expert and generated kernels, logs, tests, results);
  5. HOME and /tmp writable scratch, the repository's tmpfs read-only; exec COMMAND in
     the workspace.
It needs Linux with unprivileged user namespaces and the mount API of Linux 5.12
(open_tree, move_mount, mount_setattr). Where any step fails it exits 126 with one line
on stderr saying which; `generate --no-sandbox` runs the agent without it.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import site
import sys
from pathlib import Path

from epiforge import CHECKOUT, IMPORT_ROOT, ROOT
# the kernel's constants and mount_setattr's argument, as the judge's runner sandbox has them
from epiforge.eval.isolation import (_AT_FDCWD, _AT_RECURSIVE, _CLONE_NEWNS, _CLONE_NEWUSER, _MOUNT_ATTR_RDONLY,
                                     _MS_PRIVATE, _MS_REC, _SYS_MOUNT_SETATTR, _MountAttr)

#: in a checkout, the repository's folders that make up the package (what ./check imports),
#: and pyproject.toml, by which epiforge knows it is a checkout (epiforge/__init__.py)
PACKAGE_TREES = ("epiforge", "agent", "eval", "primitives", "tasks", "training", "primitive_docs",
                 "pyproject.toml")
#: under the package's root (checkout or installed): never readable from the sandbox
SECRET_IN_PACKAGE = ("human_kernels", "generated_kernels", "logs", "tests", ".git",
                     "eval/data", "agent/data")
#: the exit code of a sandbox that could not be set up (the shell's "cannot execute")
CANNOT = 126

_MS_NOSUID, _MS_NODEV, _AT_EMPTY_PATH = 2, 4, 0x1000
_OPEN_TREE_CLONE, _O_CLOEXEC, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0o2000000, 0x4
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 428, 429  # the same on x86-64 and arm64


class SandboxError(Exception):
    """A step of the sandbox failed: the one line the user sees."""


def python_trees() -> list[Path]:
    """The Python environment: the interpreter's prefixes and every site-packages folder."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *site.getsitepackages()]
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        paths.append(site.getusersitepackages())
    paths.append(str(Path(sys.executable).resolve().parent.parent))  # a venv's python is a link into its base
    return _existing(paths)


def visible_trees() -> list[Path]:
    """What stays visible read-only: the Python environment and the package (a checkout's
    folders of it; installed, it is in site-packages)."""
    package = [Path(IMPORT_ROOT) / name for name in PACKAGE_TREES] if CHECKOUT else []
    return _existing([*map(str, python_trees()), *map(str, package)])


def hidden_roots() -> list[Path]:
    """Each gets an empty tmpfs: the repository, the homes, /tmp and the store."""
    roots = [str(ROOT), os.environ.get("HOME", ""), "/root", "/home", "/tmp", os.environ.get("EPIFORGE_DATA_DIR", "")]
    return _outermost(_existing(roots))


def secret_paths() -> list[Path]:
    return _existing([str(Path(ROOT) / name) for name in SECRET_IN_PACKAGE])


def enter(workspace: Path, expose: list[str] = ()) -> str:
    """Shut this process in (see the module docstring); returns what it did, in words."""
    libc = ctypes.CDLL(None, use_errno=True)
    ws = workspace.resolve()
    if not ws.is_dir():
        raise SandboxError(f"the workspace {ws} is not a directory")
    uid, gid = os.getuid(), os.getgid()

    def check(ok: bool, what: str) -> None:
        if not ok:
            raise SandboxError(f"{what}: {os.strerror(ctypes.get_errno())}")

    def clone(path: Path) -> int:
        fd = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, str(path).encode(), _OPEN_TREE_CLONE | _O_CLOEXEC | _AT_RECURSIVE)
        check(fd >= 0, f"open_tree {path}")
        return fd

    def set_readonly(target, readonly: bool, recursive: bool = True, fd: int | None = None) -> None:
        attr = _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0) if readonly else _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
        flags = (_AT_RECURSIVE if recursive else 0) | (_AT_EMPTY_PATH if fd is not None else 0)
        where = b"" if fd is not None else str(target).encode()
        check(libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD if fd is None else fd, where, flags, ctypes.byref(attr),
                           ctypes.sizeof(_MountAttr)) == 0, f"mount_setattr {target}")

    def place(fd: int, path: Path, is_dir: bool = True) -> None:
        if is_dir:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        check(libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, str(path).encode(), _MOVE_MOUNT_F_EMPTY_PATH) == 0,
              f"move_mount {path}")
        os.close(fd)

    def tmpfs(path: Path) -> None:
        check(libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=0755") == 0,
              f"tmpfs over {path}")

    check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) == 0, "unshare (user and mount namespaces)")
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as e:
        raise SandboxError(f"the user namespace's id map: {e.strerror}") from None
    check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) == 0, "making / private")
    roots, secrets = hidden_roots(), secret_paths()
    # clones first: after the tmpfs mounts the originals are out of reach
    shown = [p for p in visible_trees() if _under_any(p, roots) and not _under_any(p, secrets)]
    shown = _outermost(shown + [p for p in _existing(expose) if _under_any(p, roots)])  # what the user names wins
    clones = [(p, p.is_dir(), clone(p)) for p in shown]
    ws_clone = clone(ws)
    for _, _, fd in clones:
        set_readonly(None, True, fd=fd)
    set_readonly(None, False, fd=ws_clone)
    set_readonly("/", True)
    for root in roots:
        tmpfs(root)
    for path, is_dir, fd in sorted(clones, key=lambda c: len(c[0].parts)):
        place(fd, path, is_dir)
    # what the package holds and an agent must not read, where it is still in sight: in a tree
    # put back (an installed package's folders) or outside every hidden root
    emptied = [p for p in secrets if p.is_dir() and (_under_any(p, shown) or not _under_any(p, roots))]
    for path in emptied:
        tmpfs(path)
    place(ws_clone, ws)
    scratch = {Path("/tmp"), Path("/root"), Path("/home"), Path(os.environ.get("HOME") or "/tmp").resolve()}
    for path in [*emptied, *(r for r in roots if r not in scratch)]:  # the home and /tmp stay writable scratch
        set_readonly(path, True, recursive=False)
    os.chdir(ws)
    return (f"user and mount namespaces: {ws} writable; the Python environment ({len(shown)} trees put back) "
            f"read-only; hidden: {', '.join(str(r) for r in roots)}; {len(emptied)} package folders emptied")


def command(workspace: Path, argv: list[str], expose=()) -> list[str]:
    """argv as the harness runs it inside the sandbox (with launch_env())."""
    exposed = [x for p in expose for x in ("--expose", str(p))]
    return [sys.executable, "-m", "epiforge.agent.sandbox", "--workspace", str(workspace), *exposed, "--", *argv]


def launch_env() -> dict:
    """What the sandbox's own start needs in its environment: epiforge importable."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(IMPORT_ROOT), os.environ.get("PYTHONPATH")]))}


def available(workspace: Path | None = None, expose=()) -> tuple[bool, str]:
    """Whether this machine can set the sandbox up (one running `true`, in `workspace` or a
    throwaway folder), and if not, the one line that says why."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        run = subprocess.run(command(Path(workspace or scratch), ["true"], expose), capture_output=True, text=True,
                             timeout=60, env=os.environ | launch_env())
    return run.returncode == 0, (run.stderr.strip().splitlines() or [f"exit code {run.returncode}"])[-1]


def _existing(paths) -> list[Path]:
    out = []
    for p in paths:
        if p and Path(p).exists():
            q = Path(p).resolve()
            if q not in out:
                out.append(q)
    return out


def _under_any(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _outermost(paths: list[Path]) -> list[Path]:
    """The paths none of the others holds."""
    return [p for p in paths if not any(q != p and q in p.parents for q in paths)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("sandbox: usage: python -m epiforge.agent.sandbox --workspace WS [--expose PATH ...] -- COMMAND ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="sandbox")
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--expose", action="append", default=[], help="a path to keep visible, read-only")
    args = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        print("sandbox: no command after --", file=sys.stderr)
        return 2
    try:
        enter(Path(args.workspace), args.expose)
    except (SandboxError, OSError) as e:
        print(f"sandbox: {e} (the agent's sandbox needs Linux with unprivileged user namespaces and the mount API "
              "of Linux 5.12; `generate --no-sandbox` runs the agent without it)", file=sys.stderr)
        return CANNOT
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"sandbox: cannot run {command[0]!r}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
