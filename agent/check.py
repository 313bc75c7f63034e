"""The `check` script of a command-backend workspace: evaluate its kernel.py now and print
the same feedback the tools give (python -m epiforge.agent.check --task T --kernel kernel.py).
Each run is appended to a JSONL file the backend reads back into the session log.

Its timeout is the task's (agent/tools.py check_timeout_s), cut to end CHECK_MARGIN_S before
$EPIFORGE_DEADLINE (the Unix time at which the harness kills the agent's run, which the
session's wall-time budget bounds), so that the agent still reads the verdict; while it
runs it prints each stage and a line every 15 s, as run_check does: a hanging kernel is
never silence."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

#: the environment variable the command backend sets: when its run of the agent is killed
DEADLINE_ENV = "EPIFORGE_DEADLINE"
#: seconds a check leaves the agent, before the deadline, to read its verdict
CHECK_MARGIN_S = 5.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check", description="evaluate kernel.py with the epiforge evaluator")
    ap.add_argument("--task", required=True)
    ap.add_argument("--kernel", default="kernel.py")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also cross-compile the epilogues for sm_90a (slower, catches GPU-only errors)")
    ap.add_argument("--tuned", action="store_true",
                    help="also cross-compile every epilogue with each config of kernel.py's TUNED table (slower)")
    ap.add_argument("--dtype", default=None, metavar="PRECISIONS",
                    help="judge only these precisions (bf16, fp16, a comma list; default: every one the task lists)")
    ap.add_argument("--record", default=None, help="append a one-line summary of the run to this JSONL file")
    args = ap.parse_args(argv)

    from epiforge import tasks
    from epiforge.agent.feedback import describe, scrub
    from epiforge.agent.tools import Progress, bounded_timeout, check_timeout_s, wall_timeout_message
    from epiforge.eval import evaluate
    from epiforge.eval.kernel import KernelError
    from epiforge.tasks import TaskError

    deadline = os.environ.get(DEADLINE_ENV)
    try:
        left = float(deadline) - time.time() - CHECK_MARGIN_S if deadline else None
    except ValueError:
        print(f"check: ${DEADLINE_ENV} must be a Unix time in seconds (got {deadline!r})")
        return 2
    try:
        task = tasks.get_task(args.task)
    except TaskError as e:
        print(f"check: {e}")
        return 2
    if left is not None and left <= 0:
        line = "the session's wall-time budget is spent: the kernel was not evaluated"
        print(f"check: {line}")
        _record(args.record, {"outcome": "NOT_RUN", "message": line})
        return 1
    from epiforge.eval.evaluation import pick_dtypes

    try:
        precisions = pick_dtypes(task, args.dtype)
    except ValueError as e:
        print(f"check: {e}")
        return 2
    if args.tuned and not args.compile:
        print("check: --tuned builds the TUNED configs with the cross-compile: drop --no-compile")
        return 2
    limit = check_timeout_s(task, "cpu", "smoke", args.compile, precisions=len(precisions))
    if args.tuned:  # each TUNED config is one more build of every GEMM launch (an unreadable kernel: the judge says so)
        from epiforge.primitives.config import tuned_in_source

        try:
            configs = set(tuned_in_source(Path(args.kernel).read_text(errors="replace")).values())
        except OSError:
            configs = set()
        limit += 120 * task.gemm_count * len(configs)
    timeout, by_wall = bounded_timeout(limit, left)
    kernel = Path(args.kernel).resolve()
    seed = secrets.randbelow(2**31)
    try:
        with Progress(lambda line: print(line, flush=True), "check (CPU, smoke)", timeout) as progress:
            result = evaluate(task.name, kernel, device="cpu", shapes="smoke", seed=seed, compile=args.compile,
                              timeout_s=timeout, on_stage=progress.stage, dtype=precisions,
                              tuned=args.tuned and args.compile)
    except KernelError as e:
        line = scrub(str(e).splitlines()[0], kernel.parent)
        print(f"check: {line}")
        _record(args.record, {"outcome": "UNUSABLE", "message": line})
        return 1
    if by_wall and result.outcome.value == "TIMEOUT":
        result = result.model_copy(update={"message": wall_timeout_message(result.message, limit)})
    print(describe(result, what="check", workspace=kernel.parent))
    _record(args.record, {"outcome": result.outcome.value, "kernel_sha256": result.kernel_sha256, "seed": seed,
                          "compile": args.compile, "dtypes": result.dtypes, "wall_s": result.wall_s, "timeout_s": round(timeout, 1)})
    return 0 if result.passed else 1


def _record(path: str | None, entry: dict) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    sys.exit(main())
