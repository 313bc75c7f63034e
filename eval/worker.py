"""The evaluation worker: runs ONE candidate kernel in its own process (fresh CUDA context,
private temp dir, started by eval.isolation) and reports over a private pipe.

    python -m eval.worker --result-fd N   < request.json

Stages: load (import the kernel) -> compile (marked while primitives cross-compile or
first launch an epilogue) -> numerics (eval/numerics.py, every shape) -> on a GPU, per
shape: launches -> benchmark -> recheck -> plausibility (eval/gpu_stages.py).

The channel: newline-delimited JSON frames on an inherited pipe fd, each carrying the
nonce the harness sent on stdin; progress frames {"stage": ...} and one final
{"result": ...}. The fd is made non-inheritable at once (no grandchild keeps it open) and
the process ends with os._exit right after the result frame (nothing of the kernel's runs
after it). A kernel writing to the pipe cannot forge the nonce without reading this
process's memory, which the static rules forbid; anything malformed on the channel is
reported as tampering (eval/isolation.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import traceback

import torch

from eval.guard import TamperCheck
from eval.kernel import load_kernel_module
from eval.numerics import Breach, check_shape, describe_exception
from eval.plausibility import Ceilings
from eval.result import Outcome, ShapeResult, worst_element
from tasks import get_task, shape_sets


class Channel:
    def __init__(self, fd: int, nonce: str):
        self.fd, self.nonce = fd, nonce

    def send(self, **frame) -> None:
        data = (json.dumps({"nonce": self.nonce, **frame}) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def stage(self, name: str) -> None:
        self.send(stage=name)


def _load_module(path: str):
    try:
        module = load_kernel_module(path)
    except Exception as e:  # the kernel's own import-time code failed
        traceback.print_exc()
        raise Breach(Outcome.COMPILE_ERROR, f"importing the kernel failed: {type(e).__name__}: {e}".splitlines()[0]) from e
    if not callable(getattr(module, "run", None)):
        raise Breach(Outcome.STATIC_REJECTED, "the kernel defines no run(inputs, prepared, config=None)")
    return module


def _mark_compiles(at, current: dict) -> None:
    """Report the compile stage while primitives build a GPU kernel, so a compiler that
    kills the process is told apart from a kernel that does (the harness reads the stage)."""
    import primitives.lowering as low

    cross, launch, seen = low.cross_compile, low.launch, set()

    def marked_cross(epi, call, config):
        before = current["stage"]
        at("compile")
        try:
            return cross(epi, call, config)
        finally:
            at(before)

    def marked_launch(epi, call, config):
        key = (epi.name, config.key(), epi.mode)
        if key in seen:
            return launch(epi, call, config)
        seen.add(key)
        before = current["stage"]
        at("compile")  # the first launch of an epilogue and config JIT-compiles it
        try:
            return launch(epi, call, config)
        finally:
            at(before)

    low.cross_compile, low.launch = marked_cross, marked_launch


def environment(device: str) -> dict:
    import importlib.metadata as md

    env = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()}
    for pkg in ("nvidia-cutlass-dsl", "quack-kernels", "triton"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    if device == "cuda":
        env |= {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
                "capability": ".".join(map(str, torch.cuda.get_device_capability()))}
    return env


def evaluate_in_process(request: dict, stage=lambda name: None) -> dict:
    """The whole worker job; returns the result object (never raises)."""
    device = request["device"]
    per_shape: list[ShapeResult] = []
    current = {"stage": "load"}

    def at(name):
        current["stage"] = name
        stage(name)

    def result(outcome: Outcome, message: str, violations=()):
        lowering = sys.modules.get("primitives.lowering")
        return {"outcome": outcome.value, "message": message, "stage": current["stage"],
                "per_shape": [r.model_dump(mode="json") for r in per_shape], "violations": list(violations),
                "worst": worst_element(per_shape), "compiled": list(lowering.COMPILE_LOG) if lowering else [],
                "environment": env}

    env = {}
    try:
        at("load")
        task = get_task(request["task"])
        sets = shape_sets()
        if request["shapes"] not in sets:
            raise Breach(Outcome.RUNTIME_ERROR, f"unknown shape set {request['shapes']!r}; known: {sorted(sets)}")
        ceilings = Ceilings.from_env()  # read before the kernel is imported
        if device == "cuda":
            torch.cuda.init()
            if request.get("gpu_memory_gib"):
                total = torch.cuda.get_device_properties(0).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, request["gpu_memory_gib"] * 2**30 / total))
            from primitives.lowering import _import_quack

            _import_quack()  # before the tamper snapshot: quack's import is not the kernel's doing
            from eval.gpu_stages import profile_launches

            profile_launches(lambda: None)  # the profiler's lazy set-up, likewise
        env = environment(device)
        tamper = TamperCheck()
        _mark_compiles(at, current)
        module = _load_module(request["kernel_path"])
        patched = tamper.changed()
        if patched:
            raise Breach(Outcome.RUNTIME_ERROR, f"importing the kernel patched {patched[:5]}")
        for i, shape in enumerate(sets[request["shapes"]]):
            at("numerics")
            res, outputs = check_shape(task, module, shape, request["seed"], i, device, tamper=tamper)
            del outputs
            per_shape.append(res)
            if res.outcome == Outcome.PASSED and device == "cuda":
                from eval.gpu_stages import run_gpu_stages

                run_gpu_stages(task, module, shape, res, request["seed"], i, stage=at, tamper=tamper,
                               ceilings=ceilings, reps=request.get("reps", 50), shapes_name=request["shapes"])
            if res.outcome != Outcome.PASSED:
                return result(res.outcome, f"{res.shape}: {res.message}")
        at("done")
        msg = f"all {len(per_shape)} shapes within tolerance ({per_shape[0].trials if per_shape else 0} trials each)"
        if device == "cuda":
            ratios = ", ".join(f"{r.shape} {r.timing['fused_over_gemm_only']:.3f}" for r in per_shape if r.timing)
            msg += f"; fused / GEMM-only: {ratios}"
        return result(Outcome.PASSED, msg)
    except Breach as b:
        return result(b.outcome, b.message)
    except Exception as e:  # the kernel raised in a GPU stage, or the harness itself failed
        traceback.print_exc()
        outcome, line = describe_exception(e)
        return result(outcome, line)


def run_shape(task, module, shape, seed: int, device: str) -> ShapeResult:
    """One shape's numerics in this process (bench/check_gpu.py, trusted expert kernels)."""
    return check_shape(task, module, shape, seed, 0, device)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--result-fd", type=int, required=True)
    args = ap.parse_args(argv)
    os.set_inheritable(args.result_fd, False)
    request = json.loads(sys.stdin.read())
    sys.stdin.close()
    channel = Channel(args.result_fd, request.pop("nonce", ""))
    out = evaluate_in_process(request, channel.stage)
    channel.send(result=out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing of the kernel's (atexit, threads, CUDA teardown) runs after the result


if __name__ == "__main__":
    sys.exit(main())
