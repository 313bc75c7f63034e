"""Copy finished `generate` sessions into the repository: the log to logs/generated/, and the
kernel with its origin.json to generated_kernels/<task>/ when the session wrote one.

    python -m lab.collect_session DATA_DIR/sessions/<session>.jsonl [...]

The log is copied line for line, byte for byte, but for one field: session_ended's
generated_kernel, the path the harness wrote the kernel to (a scratch folder of this machine),
becomes the kernel's path in the repository (logs/generated/README.md says so). A session
that ended without a kernel (failed, or out of budget) is copied whole: pass@k counts it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def collect(log: Path, repo: Path = REPO) -> str:
    """Copy one session into `repo` (logs/generated/, generated_kernels/); returns a line
    saying what was copied."""
    lines = log.read_bytes().splitlines(keepends=True)
    ends = [i for i, line in enumerate(lines) if b'"event":"session_ended"' in line.replace(b" ", b"")]
    if not ends:
        raise ValueError(f"{log}: no session_ended event (the session has not finished)")
    end = json.loads(lines[ends[-1]])
    out = repo / "logs" / "generated" / log.name
    if out.exists():
        raise ValueError(f"{out.relative_to(repo)} exists already")
    kernel = end.get("generated_kernel")
    said = f"{log.name}: {end['outcome']}"
    if kernel:
        src = Path(kernel) if Path(kernel).is_absolute() else repo / kernel  # inside the repo, logged relative to it
        task = src.parent.name
        dest = repo / "generated_kernels" / task / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        old_path = json.dumps(kernel, ensure_ascii=False).encode()  # as the log wrote it: UTF-8, not \u escapes
        if not any(old_path in lines[i] for i in ends):
            raise ValueError(f"{log}: its session_ended does not name {kernel!r} as written; nothing copied")
        if src.resolve() != dest.resolve():  # a session that wrote into the repository already is there
            shutil.copyfile(src, dest)
            origin = src.with_suffix(".origin.json")
            if origin.is_file():
                shutil.copyfile(origin, dest.with_suffix(".origin.json"))
        for i in ends:
            lines[i] = lines[i].replace(old_path, json.dumps(dest.relative_to(repo).as_posix(), ensure_ascii=False).encode())
        said += f", kernel -> {dest.relative_to(repo)}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(lines))
    return said


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m lab.collect_session SESSION_LOG [...]", file=sys.stderr)
        return 2
    for a in args:
        try:
            print(collect(Path(a)))
        except (OSError, ValueError) as e:
            print(f"collect_session: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
