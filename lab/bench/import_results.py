"""Turn a bench result file (lab/results/h200/final.json) into Results the leaderboard
reads, so that a machine with no GPU shows real H200 numbers, labelled with where they
came from.

    python -m lab.bench.import_results lab/results/h200/final.json --check lab/results/h200/check.json \
        --out eval/data/h200-expert.jsonl

Each task x scale row becomes one shape of the expert kernel's Result: the fused kernel's
and every baseline's Timing with its samples, and every ratio recomputed repetition by
repetition by the evaluator's own factory (eval.result.ShapeTiming.measured); "gemm_only"
is the speed of light the row chose (the fastest of cuBLAS and quack's identity GEMM at
the fused config and at the sweep's best configs). A task is PASSED only where the check
file (the evaluator, through its judge) passed it at every paper shape.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path
from epiforge.eval.machine import REPO

#: bench names -> the registry's (eval/baselines.py); the speed of light is added as gemm_only
BASELINES = {"gemm_cublas": "cublas", "gemm_quack": "quack_gemm_at_config", "gemm_quack_best": "quack_gemm_best",
             "torch_compile": "torch_compile", "liger": "liger", "quack_library": "quack_library"}


def results_from(report, check: dict | None, source: str) -> list:
    """report: an lab.bench.rows.BenchReport."""
    from epiforge.eval.result import Outcome, Result, ShapeResult, ShapeTiming

    env = {**report.environment, "imported_from": source, "rederived": report.rederived}
    passed = {}
    if check is not None:
        for row in check["rows"]:
            if row["shapes"] == "paper":
                passed.setdefault(row["task"], True)
                passed[row["task"]] &= row["outcome"] == "PASSED"
    by_task: dict[str, list] = {}
    for row in report.rows:
        timings = {"kernel": row.fused, "gemm_only": getattr(row, row.gemm_only_is)}
        notes = {"gemm_only": f"the speed of light: {row.gemm_only_is} (the fastest plain GEMM timed)"}
        for bench_name, name in BASELINES.items():
            timing = getattr(row, bench_name)
            if timing is not None and timing.samples_us:
                timings[name] = timing
        for note, name in ((row.liger_note, "liger"), (row.quack_library_note, "quack_library")):
            if note:
                notes[name] = note
        t = ShapeTiming.measured(timings, notes=notes, source="bench")
        if abs(t.fused_over_gemm_only.median - row.fused_over_gemm_only) > 1e-6:
            raise SystemExit(f"{row.task} {row.shape}: the factory's fused / GEMM-only "
                             f"{t.fused_over_gemm_only.median:.6f} differs from the file's {row.fused_over_gemm_only:.6f}")
        by_task.setdefault(row.task, []).append(
            ShapeResult(shape=row.shape, dims=row.dims, outcome=Outcome.PASSED, timing=t,
                        message=f"config {row.best_config}"))
    out = []
    for task, shapes in by_task.items():
        kernel = REPO / "human_kernels" / f"{task}.py"
        ok = passed.get(task, check is None)
        base = dict(task=task, kernel="human", kernel_sha256=hashlib.sha256(kernel.read_bytes()).hexdigest(),
                    track="expert", author="epiforge expert track", device="cuda", shapes="paper", environment=env,
                    started_at=report.environment["date"])
        out.append(Result.judged(
            base, Outcome.PASSED if ok else Outcome.INCORRECT_NUMERICS, "done" if ok else "numerics",
            ("timed by lab/bench/run.py; correct at every paper shape through the evaluator (check file)" if ok
             else "timed by lab/bench/run.py; the check file does not pass it at every paper shape"), shapes))
    return out


def main(argv=None) -> int:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", help="a bench result file (python -m lab.bench.run --tuned ...)")
    ap.add_argument("--check", default=None, help="the check file of the same kernels (python -m lab.bench.check_gpu)")
    ap.add_argument("--out", required=True, help="JSON lines, one Result each")
    args = ap.parse_args(argv)
    from lab.bench.rows import BenchReport, load_report

    try:
        report = load_report(Path(args.report), BenchReport)
    except ValueError as e:
        ap.error(str(e))
    check = json.loads(Path(args.check).read_text()) if args.check else None
    results = results_from(report, check, str(Path(args.report).resolve().relative_to(REPO)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in results:
            f.write(r.model_dump_json() + "\n")
    print(f"{len(results)} results ({sum(len(r.per_shape) for r in results)} shapes) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
