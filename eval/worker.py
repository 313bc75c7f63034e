"""The evaluation worker: runs ONE candidate kernel in its own process (fresh CUDA
context, private temp dir, started by eval.evaluate) and reports over a private pipe.

    python -m eval.worker --result-fd N   < request.json

The request names the task, the kernel file, the device, the shape set and the seed. For
each shape the worker makes fresh inputs, computes the references, runs the kernel on a
clone of the inputs, checks every output, checks the inputs were not modified, and writes
one JSON object (a list of ShapeResult dicts plus an outcome) to the result pipe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

from eval.kernel import load_kernel_module
from eval.result import Outcome, ShapeResult
from tasks import get_task, shape_sets
from tasks.tolerance import check_output

_PROBLEM_OUTCOME = {
    "missing": Outcome.INCORRECT_SHAPE,
    "shape": Outcome.INCORRECT_SHAPE,
    "dtype": Outcome.INCORRECT_DTYPE,
    "nonfinite": Outcome.INCORRECT_NUMERICS,
    "tolerance": Outcome.INCORRECT_NUMERICS,
    "rms": Outcome.INCORRECT_NUMERICS,
}


class StageError(Exception):
    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


def _load_module(path: str):
    try:
        module = load_kernel_module(path)
    except Exception as e:  # the kernel's own import-time code failed
        raise StageError(Outcome.COMPILE_ERROR, f"importing the kernel failed: {type(e).__name__}: {e}") from e
    if not callable(getattr(module, "run", None)):
        raise StageError(Outcome.STATIC_REJECTED, "the kernel defines no run(inputs, prepared, config=None)")
    return module


def _is_compile_error(e: BaseException) -> bool:
    from primitives.epilogue import EpilogueError

    if isinstance(e, EpilogueError):
        return True
    if "primitives.lowering" in sys.modules and isinstance(e, sys.modules["primitives.lowering"].CompileError):
        return True
    mod = type(e).__module__ or ""
    return mod.startswith(("cutlass", "quack")) and "Runtime" not in type(e).__name__


def _clone(inputs: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def run_shape(task, module, shape, seed: int, device: str) -> ShapeResult:
    dims = shape.dims()
    inputs = task.make_inputs(dims, seed, device)
    exact = task.reference(inputs, dims, exact=True)
    lowprec = task.reference(inputs, dims, exact=False)
    consts = {t.name: inputs[t.name].clone() for t in task.inputs if t.constant}
    given = _clone(inputs)
    try:
        prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
        outputs = module.run(given, prepared)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except Exception as e:
        outcome = Outcome.COMPILE_ERROR if _is_compile_error(e) else Outcome.RUNTIME_ERROR
        traceback.print_exc()
        return ShapeResult(shape=shape.name, dims=dims, outcome=outcome, message=f"{type(e).__name__}: {e}".splitlines()[0])
    if not isinstance(outputs, dict):
        return ShapeResult(shape=shape.name, dims=dims, outcome=Outcome.INCORRECT_SHAPE,
                           message=f"run() returned {type(outputs).__name__}, not a dict of outputs")
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and not torch.equal(given[k], v):
            return ShapeResult(shape=shape.name, dims=dims, outcome=Outcome.RUNTIME_ERROR,
                               message=f"the kernel modified its input {k!r}")
    checks = [check_output(o, outputs.get(o.name), exact[o.name], lowprec[o.name]) for o in task.outputs]
    extra = set(outputs) - {o.name for o in task.outputs}
    failed = [c for c in checks if not c.ok]
    if failed:
        first = failed[0]
        return ShapeResult(shape=shape.name, dims=dims, outcome=_PROBLEM_OUTCOME[first.problem], outputs=checks,
                           message="; ".join(c.detail for c in failed))
    msg = f"unexpected extra outputs {sorted(extra)} ignored" if extra else ""
    return ShapeResult(shape=shape.name, dims=dims, outcome=Outcome.PASSED, outputs=checks, message=msg)


def evaluate_in_process(request: dict) -> dict:
    """The whole worker job; returns the result object (never raises)."""
    try:
        task = get_task(request["task"])
        sets = shape_sets()
        if request["shapes"] not in sets:
            raise StageError(Outcome.RUNTIME_ERROR, f"unknown shape set {request['shapes']!r}; known: {sorted(sets)}")
        module = _load_module(request["kernel_path"])
        per_shape = []
        for i, shape in enumerate(sets[request["shapes"]]):
            res = run_shape(task, module, shape, request["seed"] + i, request["device"])
            per_shape.append(res)
            if res.outcome != Outcome.PASSED:
                break
        bad = [r for r in per_shape if r.outcome != Outcome.PASSED]
        outcome = bad[0].outcome if bad else Outcome.PASSED
        message = f"{bad[0].shape}: {bad[0].message}" if bad else f"all {len(per_shape)} shapes within tolerance"
        return {"outcome": outcome.value, "message": message, "per_shape": [r.model_dump(mode="json") for r in per_shape],
                "compiled": _compile_log()}
    except StageError as e:
        return {"outcome": e.outcome.value, "message": e.message, "per_shape": [], "compiled": _compile_log()}
    except Exception as e:
        traceback.print_exc()
        return {"outcome": Outcome.RUNTIME_ERROR.value, "message": f"{type(e).__name__}: {e}".splitlines()[0],
                "per_shape": [], "compiled": _compile_log()}


def _compile_log() -> list[dict]:
    lowering = sys.modules.get("primitives.lowering")
    return list(lowering.COMPILE_LOG) if lowering else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--result-fd", type=int, required=True)
    args = ap.parse_args(argv)
    # the result pipe is ours: keep it away from the kernel's inherited descriptors
    result = os.fdopen(args.result_fd, "w")
    request = json.loads(sys.stdin.read())
    out = evaluate_in_process(request)
    result.write(json.dumps(out))
    result.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
