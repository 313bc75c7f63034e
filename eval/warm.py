"""Warming the baselines' compile caches before a GPU comparison of many tasks.

Each judge builds its task's baselines from nothing: torch.compile's Inductor run, Liger's
and FlashInfer's JIT builds, quack's library epilogues. All of them keep what they built on
the machine's disk (Inductor's FX-graph and Triton caches, ~/.cache/flashinfer, quack's
cache), so a second judge of the same task loads it instead. `compare --all` on a GPU first
builds every task's baselines here, several tasks at a time, in processes that run with the
judge's own environment (eval/isolation.clean_env) and through the judge's own code
(eval/baselines.extra_baselines, at each named shape, in the judge's order), so the judges
that follow find what they would have built. Nothing is timed here, and all of it ends
before the first judge starts: no timed phase ever shares the GPU with this work. A task
that fails to warm is only slower to judge; its judge builds, and reports, the same thing.

Opt-in (`compare --all --warm`): what it saves is a new machine's cold builds (quack's
library epilogues, qkn's torch.compile); a process's own first builds, which no disk cache
saves, it cannot (compare --all pays those once, in its one judge). Its measured cost and
gain: lab/results/h200/compare-all-3.md, lab/results/h200/build-costs/.

    python -m epiforge.eval.warm --task k1 --shapes paper --baselines torch_compile liger   (one task)
    warm_all(["k1", "k8"], "paper", ["torch_compile", "liger"], jobs=8)             -> {task: line}
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from epiforge.eval.isolation import clean_env, kill_group

#: how many tasks are warmed at once (each compiles on several cores: Inductor's workers)
JOBS = 6


def warm_task(task_name: str, shapes: str, baselines: list[str], device: str = "cuda") -> list[str]:
    """Build the task's asked-for baselines at each named shape, as the judge's benchmark
    stage does (seed and values do not matter: only what gets compiled). Returns one note
    per baseline left out (it does not run here)."""
    from epiforge.eval.baselines import IN_WORKER, extra_baselines
    from epiforge.eval.numerics import derive_seed
    from epiforge.tasks import get_task, shape_sets

    task = get_task(task_name)
    baselines = [b for b in baselines if b not in IN_WORKER]
    left_out = []
    for i, shape in enumerate(shape_sets()[shapes]):
        dims = shape.dims()
        inputs = [task.make_inputs(dims, derive_seed(0, i, 100), device)]
        _, _, skipped = extra_baselines(baselines, task, dims, inputs, device)
        left_out += [f"{shape.name} {name}: {why}" for name, why in skipped.items()]
        del inputs
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()
    return left_out


def warm_all(task_names: list[str], shapes: str, baselines: list[str], *, device: str = "cuda", jobs: int = JOBS,
             timeout_s: float = 300.0, on_done=None) -> dict[str, str]:
    """warm_task for each task in its own process, `jobs` at a time, all of them ended
    within timeout_s (the late ones are killed: their judges build for themselves).
    {task: "ok" | why not}; on_done(task, line) as each one ends."""
    deadline = time.monotonic() + timeout_s
    waiting, running, out = list(task_names), {}, {}
    while waiting or running:
        while waiting and len(running) < jobs:
            name = waiting.pop(0)
            cmd = [sys.executable, "-m", "epiforge.eval.warm", "--task", name, "--shapes", shapes, "--device", device,
                   "--baselines", *baselines]
            running[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                             env=clean_env(), start_new_session=True)
        for name, proc in list(running.items()):
            if proc.poll() is None and time.monotonic() < deadline:
                continue
            if proc.poll() is None:
                kill_group(proc)
                proc.wait()
                line = f"not warmed in {timeout_s:.0f} s"
            else:
                err = proc.stderr.read().decode(errors="replace").strip().splitlines()
                line = "ok" if proc.returncode == 0 else (err[-1][:200] if err else f"exit code {proc.returncode}")
            proc.stderr.close()
            del running[name]
            out[name] = line
            if on_done is not None:
                on_done(name, line)
        time.sleep(0.2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m epiforge.eval.warm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--baselines", nargs="*", default=[])
    args = ap.parse_args(argv)
    try:
        notes = warm_task(args.task, args.shapes, args.baselines, args.device)
    except Exception as e:  # one line for warm_all; the judge will meet (and report) the same
        print(f"{type(e).__name__}: {e}".splitlines()[0][:300], file=sys.stderr)
        return 1
    for line in notes:
        print(f"left out: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
