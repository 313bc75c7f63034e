"""Where a GPU judge's untimed seconds go: what the judge builds before it times anything,
measured piece by piece in one process, task after task, as `compare --all` meets them.

    python -m lab.bench.build_costs --tasks k0 k8 --shapes paper \
        --baselines torch_compile liger flashinfer quack_library --out $OUT/build-cold.json

Per task and named shape, in the judge's order: the inputs' making, the references (exact,
cuBLAS's and the mainloop's low-precision ones: the numerics stage's own work per trial),
each plain-GEMM candidate's first call (quack's identity GEMM at a config: its build or its
load from quack's cache) and each asked-for baseline's build and first call
(eval/baselines.py, built_s). Before the tasks: the process's own start (imports, CUDA).
Run it twice on one machine: the second run finds what the first left in the disk caches
(Inductor's, Triton's, quack's, FlashInfer's), so the two runs part what a cache can save
from what every process pays. Nothing is timed against anything: these are wall seconds
of one-off work, reported as such.

    python -m lab.bench.build_costs --summarize build-cold.json build-warm.json > README.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def measure(task_names: list[str], shapes: str, baselines: list[str], device: str = "cuda") -> dict:
    """{"startup_s": {...}, "tasks": {task: {"total_s", "shapes": {shape: {...}}}}}."""
    startup = {}
    t = time.perf_counter()
    import torch

    startup["import_torch"] = round(time.perf_counter() - t, 3)
    if device == "cuda":
        t = time.perf_counter()
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        startup["cuda_init"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    from epiforge.eval.baselines import close_baselines, extra_baselines, gemm_candidates
    from epiforge.eval.numerics import derive_seed, references
    from epiforge.tasks import get_task, shape_sets

    startup["import_epiforge"] = round(time.perf_counter() - t, 3)
    tasks = {}
    for name in task_names:
        task = get_task(name)
        torch._dynamo.reset()  # as the judge does between jobs (eval/judge.py _between_jobs)
        began = time.perf_counter()
        per_shape = {}
        for i, shape in enumerate(shape_sets()[shapes]):
            dims = shape.dims()
            row = {}
            t = time.perf_counter()
            inputs = task.make_inputs(dims, derive_seed(0, i, 100), device)
            _sync(device)
            row["make_inputs"] = round(time.perf_counter() - t, 3)
            t = time.perf_counter()
            exact, lowprec = references(task, inputs, dims)
            _sync(device)
            row["references"] = round(time.perf_counter() - t, 3)
            del exact, lowprec
            built: dict[str, float] = {}
            gemm_candidates(task, dims, [task.gemm_operand_sets(inputs, dims)], [], device, built_s=built)
            fns, _, skipped = extra_baselines(baselines, task, dims, [inputs], device, built_s=built)
            close_baselines(fns)
            row["built"] = built
            row["left_out"] = skipped
            per_shape[shape.name] = row
            del inputs
            if device == "cuda":
                torch.cuda.empty_cache()
        tasks[task.name] = {"total_s": round(time.perf_counter() - began, 3), "shapes": per_shape}
        print(f"{task.name}: {tasks[task.name]['total_s']:.1f} s", file=sys.stderr, flush=True)
    return {"startup_s": startup, "tasks": tasks}


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _since_process_start() -> float | None:
    """Seconds since this process began (Linux /proc), None elsewhere."""
    import os

    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)


def summarize(paths: list[Path]) -> str:
    """Markdown: per task, each file's seconds, and the largest single builds."""
    runs = [json.loads(p.read_text()) for p in paths]
    names = list(runs[0]["tasks"])
    env = runs[0].get("environment", {})
    lines = [f"# What a judge builds before it times, per task ({', '.join(p.name for p in paths)})", "",
             f"Made by `{runs[0]['command']}` and its rerun on the same machine, at commit {env.get('commit', '?')}, "
             f"{env.get('date', '?')[:10]}, on the {env.get('gpu', '?')} (driver {env.get('driver', '?')}, torch "
             f"{env.get('torch', '?')}, quack {env.get('quack-kernels', '?')}). Wall seconds, one process per file, "
             "the tasks in this order, the named shapes in each; the second file found the first's disk caches.", "",
             "| task | " + " | ".join(f"{p.stem} s" for p in paths) + " | largest builds (first file) |",
             "|---|" + "---|" * len(paths) + "---|"]
    for name in names:
        per = [r["tasks"].get(name, {}).get("total_s") for r in runs]
        items = [(f"{shape} {what}", sec) for shape, row in runs[0]["tasks"][name]["shapes"].items()
                 for what, sec in [("references", row["references"]), *row["built"].items()]]
        top = ", ".join(f"{what} {sec:.1f}" for what, sec in sorted(items, key=lambda x: -x[1])[:3] if sec >= 0.5)
        lines.append(f"| {name} | " + " | ".join("-" if x is None else f"{x:.1f}" for x in per) + f" | {top or '-'} |")
    totals = [sum(t["total_s"] for t in r["tasks"].values()) for r in runs]
    lines += ["", "All tasks: " + ", ".join(f"{p.stem} {t:.0f} s" for p, t in zip(paths, totals)) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--summarize"]:
        try:
            print(summarize([Path(a) for a in argv[1:]]), end="")
        except (OSError, ValueError, KeyError) as e:
            print(f"build_costs --summarize: cannot read {argv[1:]}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        return 0
    ap = argparse.ArgumentParser(prog="python -m lab.bench.build_costs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["all"])
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--baselines", nargs="*", default=["torch_compile", "liger", "flashinfer", "quack_library"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    from lab.bench.gpu_env import fingerprint, report_json
    from epiforge.eval.machine import command_line
    from epiforge.tasks import load_catalogue, shape_sets

    if args.shapes not in shape_sets():
        print(f"unknown shape set {args.shapes!r}; known: {', '.join(shape_sets())}", file=sys.stderr)
        return 2
    names = [t.name for t in load_catalogue()[0]] if args.tasks == ["all"] else args.tasks
    command = command_line("lab.bench.build_costs", argv)
    before = _since_process_start()  # python, torch and epiforge imported
    measured = measure(names, args.shapes, args.baselines, args.device)
    measured["startup_s"]["process_start_to_imports_done"] = before
    report = {"command": command, "environment": fingerprint(command) if args.device == "cuda" else {},
              "shapes": args.shapes, "baselines": args.baselines, **measured}
    args.out.write_text(report_json(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
