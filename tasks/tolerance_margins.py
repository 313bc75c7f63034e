"""How close the expert kernels come to the tolerance: for every task x precision x shape x
output, the worst error, the allowance (tasks/tolerance.py against Task.reference's exact
and low-precision references) and their ratio, the margin (at most 1 passes), on the max
error, on the RMS error and element by element (the largest excess over an element's own
allowance, over what the floor allows it).

    python -m epiforge.tasks.tolerance_margins --shapes smoke --device cpu --out lab/results/tolerance-margins/tolerance-margins-cpu-smoke.json
    python -m epiforge.tasks.tolerance_margins --shapes paper --device cuda --dtype all --out margins.json

The expert kernels are trusted, so they run in this process (on a CPU through the
emulator). Cases run from the smallest GEMM to the largest and the file is rewritten after
each one, so a run cut short still holds every case it finished; `--resume` takes such a
file up again (its finished cases kept, the rest run, both environments recorded).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from epiforge import tasks
from epiforge.tasks.spec import TaskCodeError
from epiforge.tasks.tolerance import RowsCheck, SumCheck, check_output
from epiforge.eval.machine import expert_kernel


def load_expert(task):
    """The task's expert kernel module (human_kernels/<name>.py), imported afresh."""
    path = expert_kernel(task.name)
    if path is None:
        raise tasks.TaskError(f"{task.name} has no expert kernel (human_kernels/{task.name}.py)")
    spec = importlib.util.spec_from_file_location(f"expert_{task.id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_expert(task, module, inputs: dict) -> dict:
    """prepare(consts) if the kernel has one, then run(inputs, prepared), on copies."""
    consts = {t.name: inputs[t.name].clone() for t in task.inputs if t.constant}
    prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
    given = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    out = module.run(given, prepared)
    if given and next(iter(given.values())).is_cuda:
        torch.cuda.synchronize()
    return out


def rows_separable(task) -> bool:
    """Every output is one row per token (its first dimension M) or a sum over the tokens
    (OutputSpec.sum_over_rows, a weight gradient), so its references can be made for
    blocks of rows from the inputs' matching rows."""
    return all(o.shape[0] == "M" or o.sum_over_rows for o in task.outputs)


def check_case(task, module, dims: dict, seed: int, device: str, row_blocks: int = 1) -> dict:
    """One kernel call on fresh inputs, judged output by output: {name: margins and verdict}.
    row_blocks > 1 (a task whose outputs are rows of tokens or sums over them): the kernel
    runs on the whole inputs as usual, and the references, whose float64 copies of a 70B
    shape do not fit a CPU's memory at once, are made for that many blocks of rows in turn:
    a row output's verdict is the same as on the whole (tasks/tolerance.check_output_rows),
    a sum's references are the blocks' partial sums added (tasks/tolerance.SumCheck)."""
    inputs = task.make_inputs(dims, seed, device)
    out = run_expert(task, module, inputs)
    from epiforge.eval.numerics import references  # the judge's own references (on a GPU: its mainloop GEMM too)

    if row_blocks > 1:
        if not rows_separable(task):
            raise ValueError(f"{task.id}: an output is neither one row per token nor a sum over them; "
                             "its references cannot be made by rows")
        checks = _checks_by_rows(task, inputs, out, dims, row_blocks, references)
    else:
        exact, lowprec = references(task, inputs, dims)
        checks = {o.name: check_output(o, out.get(o.name), exact[o.name], lowprec[o.name]) for o in task.outputs}
    rows = {}
    for o in task.outputs:
        c = checks[o.name]
        rows[o.name] = {
            "dtype": o.dtype, "ok": c.ok, "problem": c.problem,
            "max_error": c.max_error, "allowed": c.allowed,
            "margin": c.max_error / c.allowed if c.allowed else None,
            "rms_error": c.rms_error, "rms_allowed": c.rms_allowed,
            "rms_margin": c.rms_error / c.rms_allowed if c.rms_allowed else None,
            "element_excess": c.element_excess, "element_allowed": c.element_allowed,
            "element_margin": max(c.element_excess, 0.0) / c.element_allowed if c.element_allowed else None,
        }
    return rows


def _checks_by_rows(task, inputs: dict, out: dict, dims: dict, blocks: int, references) -> dict:
    m = dims["M"]
    edges = [m * i // blocks for i in range(blocks + 1)]
    by_token = {t.name for t in task.inputs if t.shape[0] == "M"}
    checks, rows, sums = {}, {}, {}
    for o in task.outputs:  # what check_output checks before any value
        got = out.get(o.name)
        want = o.concrete_shape(dims)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != want or got.dtype != o.torch_dtype:
            checks[o.name] = check_output(o, got, torch.empty(want, dtype=torch.float64), torch.empty(want))
        elif o.sum_over_rows:
            sums[o.name] = SumCheck(o, want)
        else:
            rows[o.name] = RowsCheck(o, want)
    specs = {o.name: o for o in task.outputs}
    for r0, r1 in zip(edges, edges[1:]):
        part = {k: v[r0:r1] if k in by_token else v for k, v in inputs.items()}
        exact, lowprec = references(task, part, {**dims, "M": r1 - r0})  # lowprec unrounded
        for name, check in rows.items():
            check.add(r0, out[name][r0:r1], exact[name], lowprec[name])
        for name, check in sums.items():
            check.add(exact[name], lowprec[name])
        del exact, lowprec, part
        gc.collect()
    return {**checks, **{name: check.result() for name, check in rows.items()},
            **{name: check.result(out[name]) for name, check in sums.items()}}


def environment(device: str, argv: list[str]) -> dict:
    """eval.machine's fingerprint, plus which processor ran it where there is no GPU."""
    from epiforge.eval.machine import fingerprint

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
    else:
        cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        name = f"{models[0] if models else platform.processor()} ({torch.get_num_threads()} threads)"
    return {**fingerprint("cuda" if device.startswith("cuda") else None,
                          " ".join(["python -m epiforge.tasks.tolerance_margins", *argv])), "device": name}


def worst(cases: list[dict]) -> dict:
    """Per task and output, the largest margins over precisions, shapes and seeds."""
    table: dict = {}
    for case in cases:
        for name, r in case.get("outputs", {}).items():
            w = table.setdefault(case["task"], {}).setdefault(name, {"margin": 0.0, "rms_margin": 0.0,
                                                                     "element_margin": 0.0, "ok": True})
            for key in ("margin", "rms_margin", "element_margin"):
                w[key] = max(w[key], r.get(key) or 0.0)
            w["ok"] = w["ok"] and r["ok"]
    return {t: table[t] for t in sorted(table, key=tasks.task_order)}


def _resumable(path: Path, shapes: str, seeds: list[int], row_blocks: int, device: str, dtypes: list[str]) -> dict:
    """The report at path, if a run of the same shapes, seeds, row blocks, precisions and
    kind of device made it; else SystemExit with one line (cases made otherwise would not be
    comparable). A report from before these were recorded: its device from its environment,
    its row blocks from its cases, its precision bf16."""
    try:
        before = json.loads(path.read_text())
        cases = before["cases"]
        if not isinstance(cases, list) or not all(isinstance(c, dict) and {"task", "shape", "seed"} <= set(c)
                                                  for c in cases):
            raise ValueError("its cases are not task / shape / seed records")
        made_on = before.get("device_kind") or ("cuda" if before["environment"].get("gpu") else "cpu")
        blocks = before.get("row_blocks") or max([c.get("row_blocks", 1) for c in cases if "outputs" in c] or [1])
        same = ((before["shapes"], before["seeds"], blocks, made_on, before.get("dtypes", ["bfloat16"]))
                == (shapes, seeds, row_blocks, _kind(device), dtypes))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"--resume: {path} is not a margins report ({type(e).__name__}: {e})")
    if not same:
        raise SystemExit(f"--resume: {path} was made with other --shapes, --seeds, --row-blocks, --dtype or --device "
                         f"({before['shapes']}, seeds {before['seeds']}, row blocks {blocks}, "
                         f"{', '.join(before.get('dtypes', ['bfloat16']))}, {made_on})")
    return before


def _kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="smoke", help="a shape set of tasks/shapes.toml: smoke or paper")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--out", required=True, help="the JSON file to (re)write after every case")
    ap.add_argument("--tasks", nargs="*", default=None, help="task ids (default: all)")
    ap.add_argument("--seeds", nargs="*", type=int, default=None, help="default: 0 1 2 for smoke, 0 otherwise")
    ap.add_argument("--dtype", default="all", metavar="PRECISIONS",
                    help="bfloat16 | bf16, float16 | fp16, a comma list, or all (the default: every one a task lists)")
    ap.add_argument("--row-blocks", type=int, default=1,
                    help="make the references of a task whose outputs are rows of tokens or sums over them in this many "
                         "blocks of rows (the float64 copies of a 70B shape do not fit a CPU's memory at once); "
                         "other tasks as one")
    ap.add_argument("--max-gib", type=float, default=None,
                    help="CPU: cap this process's address space; a case that needs more is recorded as an error")
    ap.add_argument("--resume", action="store_true",
                    help="keep the finished cases of an --out file made with the same --shapes, --seeds, "
                         "--row-blocks and kind of --device, and run only the rest (its errors run again)")
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([0, 1, 2] if args.shapes == "smoke" else [0])
    from epiforge.eval.evaluation import DTYPE_ALIASES

    dtypes = (None if args.dtype == "all"
              else [DTYPE_ALIASES.get(d.strip(), d.strip()) for d in args.dtype.split(",") if d.strip()])
    if dtypes is not None and (not dtypes or not set(dtypes) <= {"bfloat16", "float16"}):
        raise SystemExit(f"--dtype {args.dtype!r}: bfloat16 | bf16, float16 | fp16, a comma list of them, or all")
    recorded = dtypes or ["all"]
    before = None  # the report taken up again, checked before anything runs
    if args.resume and Path(args.out).is_file():
        before = _resumable(Path(args.out), args.shapes, seeds, args.row_blocks, args.device, recorded)
    if args.max_gib:
        limit = int(args.max_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.device.startswith("cuda"):
        try:  # the carried compiled kernels, so that the run does not compile (eval/precompiled.py)
            from epiforge.eval.precompiled import install_precompiled

            install_precompiled()
        except Exception as e:  # noqa: BLE001 - without them it compiles, slower but the same
            print(f"no precompiled kernels installed: {e}", flush=True)

    catalogue = [t for t in tasks.load_catalogue()[0] if not args.tasks or t.id in args.tasks or t.name in args.tasks]
    for t in [t for t in catalogue if expert_kernel(t.name) is None]:
        print(f"{t.id}: no expert kernel, skipped", flush=True)
    catalogue = [t for t in catalogue if expert_kernel(t.name) is not None]
    todo = [(task, shape) for task in catalogue for shape in tasks.shape_sets()[args.shapes]]
    todo.sort(key=lambda ts: (ts[0].flops(ts[1].dims()), tasks.task_order(ts[0].id)))
    report = {"environment": environment(args.device, argv), "shapes": args.shapes, "seeds": seeds, "dtypes": recorded,
              "device_kind": _kind(args.device), "row_blocks": args.row_blocks, "complete": False, "worst": {},
              "cases": []}
    out_path = Path(args.out)
    done: set[tuple[str, str, int, str]] = set()
    if before is not None:
        report["cases"] = [c for c in before["cases"] if "error" not in c]  # an error is tried again
        done = {(c["task"], c["shape"], c["seed"], c.get("dtype", "bfloat16")) for c in report["cases"]}
        report["environment"]["resumed_from"] = before["environment"]
        print(f"resuming {out_path}: {len(done)} case(s) kept", flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def write():
        report["worst"] = worst(report["cases"])
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(out_path)

    write()
    modules = {}
    for task, shape in todo:
        precisions = [p for p in task.dtypes if dtypes is None or p in dtypes]
        if all((task.id, shape.name, seed, p) in done for seed in seeds for p in precisions):
            continue
        module = modules.setdefault(task.name, load_expert(task))
        for p, seed in [(p, seed) for p in precisions for seed in seeds]:
            if (task.id, shape.name, seed, p) in done:
                continue
            case = {"task": task.id, "dtype": p, "shape": shape.name, "seed": seed,
                    "gemm_mnk": list(task.gemm_shapes(shape.dims())[0]),
                    "gemms_mnk": [list(x) for x in task.gemm_shapes(shape.dims())]}
            t0 = time.monotonic()
            try:
                blocks = args.row_blocks if rows_separable(task) else 1
                case["outputs"] = check_case(task.at(p), module, shape.dims(), seed, args.device, row_blocks=blocks)
                case["row_blocks"] = blocks
            except (RuntimeError, MemoryError, TaskCodeError) as e:  # the reference out of memory, too
                case["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            case["seconds"] = round(time.monotonic() - t0, 1)
            report["cases"].append(case)
            write()
            gc.collect()
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            summary = case.get("error") or "  ".join(
                f"{n}: {r['margin']:.3f}/{r['rms_margin']:.3f}/{r['element_margin'] or 0:.3f}{'' if r['ok'] else ' FAIL'}"
                for n, r in case["outputs"].items())
            print(f"{task.id} {p} {shape.name} seed {seed} ({case['seconds']} s)  margin max/rms/element  {summary}",
                  flush=True)
    report["complete"] = True
    write()
    failed = [c for c in report["cases"] if "error" in c or not all(r["ok"] for r in c["outputs"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
