"""The product's files a command passes through on its way to a verdict: every epiforge module
imported by any of its processes (the CLI, the judge, its runners, the agent CLI's checks),
counted once (files, not processes), with their lines.

    python -m lab.path_files [--json FILE] -- eval --task k1 --kernel human --device cpu --shapes smoke

How: a sitecustomize.py on PYTHONPATH (which the judge and its runners keep:
eval/isolation.py ENV_NAMES) puts a finder first on sys.meta_path in every process; it
appends the name of each module its process imports for the first time to one file
(EPIFORGE_PATH_TRACE), and forked processes inherit it. The runners' sandbox would make that
file read-only to them, so the command runs with EPIFORGE_RUNNER_SANDBOX=0: a measurement of
the lab's own commands (expert kernels), never of generated code. A module the kernel imports
as `primitives` is epiforge.primitives. Imported is not executed: a module imported for one
function counts whole.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from epiforge import ROOT

SITECUSTOMIZE = '''
import os, sys
_trace = os.environ.get("EPIFORGE_PATH_TRACE")
if _trace:
    class _Seen:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("epiforge", "primitives"):
                try:
                    with open(_trace, "a") as f:
                        f.write(name + "\\n")
                except OSError:
                    pass
            return None
    sys.meta_path.insert(0, _Seen())
'''


def trace(argv: list[str], timeout_s: float = 600) -> tuple[int, list[str]]:
    """Run `python -m epiforge ARGV` traced; returns its exit code and the module names seen."""
    with tempfile.TemporaryDirectory(prefix="path-files-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        out = Path(tmp, "modules.txt")
        env = {**os.environ, "EPIFORGE_PATH_TRACE": str(out), "EPIFORGE_RUNNER_SANDBOX": "0",
               "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH", "")]))}
        proc = subprocess.run([sys.executable, "-m", "epiforge", *argv], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        names = out.read_text().split() if out.is_file() else []
    return proc.returncode, sorted(set(names))


def files_of(names: list[str]) -> list[Path]:
    """The product's source files of these module names (repo-relative, existing files only)."""
    files = set()
    for name in names:
        full = "epiforge." + name if name.split(".")[0] == "primitives" else name
        try:
            spec = importlib.util.find_spec(full)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = Path(spec.origin).resolve()
        try:
            files.add(path.relative_to(ROOT))
        except ValueError:
            continue
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the epiforge command's arguments")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the epiforge command after --")
    code, names = trace(command)
    files = files_of(names)
    lines = {str(f): sum(1 for _ in (ROOT / f).open()) for f in files}
    shown = [a.replace(str(ROOT), ".") for a in command]  # no machine path in a committed file
    for f, n in lines.items():
        print(f"{n:6d}  {f}")
    print(f"{len(files)} files, {sum(lines.values())} lines: `epiforge {' '.join(shown)}` (exit {code})")
    if args.json:
        args.json.write_text(json.dumps({"command": ["epiforge", *shown], "exit": code, "files": lines}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
