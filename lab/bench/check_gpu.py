"""Correctness of the expert track on the GPU: every kernel at the smoke and paper shapes
(and the hidden shape the evaluator adds to each set) under its task's tolerance, and its
launches counted with the torch profiler (the task's fused CuTe-DSL GEMMs plus its named
finishing steps, nothing else): the evaluator itself (eval.evaluate with timing off), so
this check is exactly the one every candidate gets.

    python -m lab.bench.check_gpu [--tasks k0 k1] [--shapes smoke paper] [--one-process] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--shapes", nargs="*", default=["smoke", "paper"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--jobs", type=int, default=4, help="evaluations at a time (nothing is timed)")
    ap.add_argument("--one-process", action="store_true",
                    help="each kernel run in its own process, not from its description (the judge's default)")
    args = ap.parse_args(argv)

    from epiforge import tasks
    from lab.bench.gpu_env import fingerprint
    from epiforge.eval.machine import command_line
    from epiforge.eval.precompiled import install_precompiled
    from epiforge.eval import evaluate
    from lab.bench.rows import CheckReport, CheckRow

    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    from epiforge.eval.machine import expert_kernel

    picked = [t for t in tasks.load_catalogue()[0] if not args.tasks or t.id in args.tasks]
    for t in picked:
        if expert_kernel(t.name) is None:
            print(f"{t.id}: no expert kernel, skipped", flush=True)
    jobs = [(task, set_name) for task in picked if expert_kernel(task.name) for set_name in args.shapes]

    def one(job):
        task, set_name = job
        t0 = time.monotonic()
        return task, set_name, evaluate(task.name, "human", device="gpu", shapes=set_name, seed=1000, timing=False,
                                          launcher=not args.one_process), \
            round(time.monotonic() - t0, 1)

    rows, ok_all = [], True
    # nothing is timed: evaluations may share the GPU (each is its own judge and runner)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(pool.map(one, jobs))
    for task, set_name, r, seconds in done:
        ok_all &= r.passed
        for res in r.per_shape:
            rows.append(CheckRow.of(task.name, set_name, res))
            worst = max((c.max_error / c.allowed for c in res.outputs if c.allowed and c.max_error is not None),
                        default=float("nan"))
            print(f"{task.id} {set_name}/{res.shape}: {res.outcome.value} worst/allowed={worst:.3f} "
                  f"{res.message[:200]}", flush=True)
        if not r.passed:
            print(f"{task.id} {set_name}: {r.outcome.value} ({r.stage}): {r.message}\n{r.stderr_tail[-1500:]}", flush=True)
        print(f"{task.id} {set_name}: {seconds} s; runner sandbox: {r.environment.get('runner_sandbox')}", flush=True)
    report = CheckReport(environment=fingerprint(command_line("lab.bench.check_gpu", argv)), all_passed=ok_all, rows=rows)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report.model_dump_json(indent=1))
    print("ALL PASSED" if ok_all else "FAILURES", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
