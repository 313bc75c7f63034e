"""Correctness of the expert track on the GPU: every kernel at the smoke and paper shapes
under its task's tolerance, and its launches counted with the torch profiler (one fused
CuTe-DSL GEMM plus the task's named finishing steps, nothing else).

    python -m bench.check_gpu [--tasks k0 k1] [--shapes smoke paper] [--out FILE.json]

Runs the trusted expert kernels in this process (eval/worker.py's per-shape check);
candidate kernels go through the isolated evaluator instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def count_launches(fn) -> list[str]:
    """Names of the CUDA kernels fn launches (after a warm-up call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name and "Memcpy" not in e.name and "Memset" not in e.name]


def classify(names: list[str], launches: list[str]) -> tuple[bool, str]:
    """One CuTe-DSL fused GEMM plus exactly the task's named finishers (eval.launches)."""
    from eval.launches import Launch, classify as judge

    verdict = judge([Launch(n) for n in names], launches)
    return verdict.ok, verdict.message


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--shapes", nargs="*", default=["smoke", "paper"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import tasks
    from bench.gpu_env import command_line, fingerprint, install_precompiled
    from eval.kernel import HUMAN_DIR, load_kernel_module
    from eval.worker import run_shape

    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    rows, ok_all = [], True
    for task in tasks.load_catalogue()[0]:
        if args.tasks and task.id not in args.tasks:
            continue
        module = load_kernel_module(HUMAN_DIR / f"{task.name}.py")
        for set_name in args.shapes:
            for i, shape in enumerate(tasks.shape_sets()[set_name]):
                t0 = time.monotonic()
                res = run_shape(task, module, shape, seed=1000 + i, device="cuda")
                row = {"task": task.name, "shapes": set_name, "shape": shape.name, "outcome": res.outcome.value,
                       "message": res.message, "seconds": round(time.monotonic() - t0, 1),
                       "outputs": [c.model_dump() for c in res.outputs]}
                # every shape: the paper shapes run at the kernels' tuned configs, the smoke ones at the default
                inputs = task.make_inputs(shape.dims(), 7, "cuda")
                consts = {t.name: inputs[t.name] for t in task.inputs if t.constant}
                prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
                names = count_launches(lambda: module.run(inputs, prepared))  # noqa: B023 - called here
                row["launches_ok"], row["launches"] = classify(names, task.launches)
                row["launch_names"] = names
                ok_all &= row["launches_ok"]
                ok_all &= res.outcome.value == "PASSED"
                rows.append(row)
                worst = max((c.max_error / c.allowed for c in res.outputs if c.allowed), default=float("nan"))
                print(f"{task.id} {set_name}/{shape.name}: {res.outcome.value} worst/allowed={worst:.3f} "
                      f"{row.get('launches', '')} {res.message[:200]} ({row['seconds']} s)", flush=True)
                torch.cuda.empty_cache()
    report = {"environment": fingerprint(command_line("bench.check_gpu", argv)), "all_passed": ok_all, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print("ALL PASSED" if ok_all else "FAILURES", flush=True)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
