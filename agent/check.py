"""The `check` script of a command-backend workspace: evaluate its kernel.py now and print
the same feedback the tools give (python -m epiforge.agent.check --task T --kernel kernel.py).
Each run is appended to a JSONL file the backend reads back into the session log."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check", description="evaluate kernel.py with the epiforge evaluator")
    ap.add_argument("--task", required=True)
    ap.add_argument("--kernel", default="kernel.py")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also cross-compile the epilogues for sm_90a (slower, catches GPU-only errors)")
    ap.add_argument("--record", default=None, help="append a one-line summary of the run to this JSONL file")
    args = ap.parse_args(argv)

    from epiforge.agent.feedback import describe, scrub
    from epiforge.eval import evaluate
    from epiforge.eval.kernel import KernelError

    kernel = Path(args.kernel).resolve()
    seed = secrets.randbelow(2**31)
    try:
        result = evaluate(args.task, kernel, device="cpu", shapes="smoke", seed=seed, compile=args.compile)
    except KernelError as e:
        line = scrub(str(e).splitlines()[0], kernel.parent)
        print(f"check: {line}")
        _record(args.record, {"outcome": "UNUSABLE", "message": line})
        return 1
    print(describe(result, what="check", workspace=kernel.parent))
    _record(args.record, {"outcome": result.outcome.value, "kernel_sha256": result.kernel_sha256, "seed": seed,
                          "compile": args.compile, "wall_s": result.wall_s})
    return 0 if result.passed else 1


def _record(path: str | None, entry: dict) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    sys.exit(main())
