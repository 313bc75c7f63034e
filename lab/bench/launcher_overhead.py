"""Does the judge's launcher mode change what it times? Each task's expert kernel judged
twice in ONE interleaved compare run per shape: as "one-process" (the kernel's own run(),
the judge's default) and as "launcher" (its description, primitives/program.py, run by a
process that loads no kernel code). launcher / one-process is taken repetition by
repetition; 1.0 means running the description costs nothing per call.

    python -m lab.bench.launcher_overhead --tasks k1 k7 --shapes paper --out FILE.json [--reps 30]

Prints one line per task and shape; writes lab.bench.rows.LauncherReport (the rows and
every Result). Exit 1 if a kernel failed in either mode (its Result says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ONE_PROCESS, LAUNCHER = "one-process", "launcher"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["k1", "k0", "k7", "k5"])
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from epiforge import tasks
    from lab.bench.gpu_env import fingerprint, report_json
    from epiforge.eval.machine import command_line
    from epiforge.eval.precompiled import install_precompiled
    from lab.bench.rows import LauncherReport, LauncherRow
    from epiforge.eval.compare import compare_all
    from lab.bench.compare_export import scrub_paths
    from epiforge.eval.kernel import expert_kernel
    from epiforge.eval.machine import REPO

    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    plans = []
    for t in args.tasks:
        name = tasks.get_task(t).name
        path = expert_kernel(name)
        if path is None:
            raise SystemExit(f"launcher_overhead: {t} has no expert kernel")
        plans.append((name, [(ONE_PROCESS, Path(path)), (LAUNCHER, Path(path))]))
    comparisons = compare_all(plans, device="gpu", shapes=args.shapes, seed=args.seed, reps=args.reps, baselines=[],
                              launcher=frozenset({LAUNCHER}))
    rows, ok = [], True
    for cmp in comparisons:
        for label, r in zip(cmp.labels, cmp.results):
            if not r.passed:
                ok = False
                print(f"{cmp.task} {label}: {r.outcome.value} ({r.stage}): {r.message}", flush=True)
        shapes = [s.shape for s in cmp.results[0].per_shape if s.timing and not s.hidden]
        for shape in shapes:
            row = LauncherRow.of(cmp, shape, ONE_PROCESS, LAUNCHER)
            if row is None:
                continue
            rows.append(row)
            q = row.launcher_over_one_process
            print(f"{row.task} {shape}: launcher / one-process {q.median:.3f} [{q.ci_low or q.q1:.3f}, "
                  f"{q.ci_high or q.q3:.3f}]; fused / GEMM-only {row.fused_over_gemm_only[ONE_PROCESS]:.3f} "
                  f"(one-process), {row.fused_over_gemm_only[LAUNCHER]:.3f} (launcher)", flush=True)
    results = [r.model_copy(update={"kernel": str(Path(r.kernel).resolve().relative_to(REPO)),
                                    "stderr_tail": scrub_paths(r.stderr_tail)})  # no machine path in the file
               for c in comparisons for r in c.results]
    report = LauncherReport(environment=fingerprint(command_line("lab.bench.launcher_overhead", argv)), reps=args.reps,
                            rows=rows, results=results)
    Path(args.out).write_text(report_json(report.model_dump(mode="json")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
