"""Correctness of the expert track on the GPU: every kernel at the smoke and paper shapes
(and the hidden shape the evaluator adds to each set) under its task's tolerance, and its
launches counted with the torch profiler (one fused CuTe-DSL GEMM plus the task's named
finishing steps, nothing else): the evaluator itself (eval.evaluate with timing off), so
this check is exactly the one every candidate gets.

    python -m bench.check_gpu [--tasks k0 k1] [--shapes smoke paper] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--shapes", nargs="*", default=["smoke", "paper"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import tasks
    from bench.gpu_env import command_line, fingerprint, install_precompiled
    from eval import evaluate

    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    rows, ok_all = [], True
    for task in tasks.load_catalogue()[0]:
        if args.tasks and task.id not in args.tasks:
            continue
        for set_name in args.shapes:
            t0 = time.monotonic()
            r = evaluate(task.name, "human", device="gpu", shapes=set_name, seed=1000, timing=False)
            ok_all &= r.passed
            for res in r.per_shape:
                row = {"task": task.name, "shapes": set_name, "shape": res.shape, "hidden": res.hidden,
                       "outcome": res.outcome.value, "message": res.message,
                       "outputs": [c.model_dump() for c in res.outputs], "launch_names": res.launches,
                       "launches_ok": res.outcome.value == "PASSED" and (res.hidden or bool(res.launches))}
                rows.append(row)
                worst = max((c.max_error / c.allowed for c in res.outputs if c.allowed and c.max_error is not None),
                            default=float("nan"))
                print(f"{task.id} {set_name}/{res.shape}: {res.outcome.value} worst/allowed={worst:.3f} "
                      f"{res.message[:200]}", flush=True)
            if not r.passed:
                print(f"{task.id} {set_name}: {r.outcome.value} ({r.stage}): {r.message}\n{r.stderr_tail[-1500:]}",
                      flush=True)
            print(f"{task.id} {set_name}: {round(time.monotonic() - t0, 1)} s", flush=True)
    report = {"environment": fingerprint(command_line("bench.check_gpu", argv)), "all_passed": ok_all, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print("ALL PASSED" if ok_all else "FAILURES", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
