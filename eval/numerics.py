"""Numerics: checked calls of a kernel on fresh inputs, with every check around the call.

One trial = fresh inputs from a seed derived from the secret master seed, the references
(float64 "exact" and the plain low-precision PyTorch result, which sets the allowance),
prepare() on clones of the constant inputs, then run() on clones of the inputs with
uninitialized memory poisoned (eval/guard.py) and, on a CPU, the compute guard on. After
the call, in this order:
  torch, the timers or the checker patched          RUNTIME_ERROR
  inputs, constants or `prepared` modified          RUNTIME_ERROR
  torch compute outside primitives (CPU guard)      EXTRA_LAUNCHES
  not a dict / an output missing or misshapen        INCORRECT_SHAPE
  an output aliasing an input, `prepared`, or an
  output of an earlier call still held               RUNTIME_ERROR
  wrong dtype                                       INCORRECT_DTYPE
  NaN/Inf or outside the tolerance rule              INCORRECT_NUMERICS (worst element)
Each shape runs two trials: the reference computed before the kernel, then the kernel
before the reference, so neither can find the other's results in recycled memory.
"""

from __future__ import annotations

import hashlib
import sys
import traceback
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from eval.guard import ComputeGuard, TamperCheck, poisoned_allocations
from eval.result import Outcome, ShapeResult
from tasks.tolerance import OutputCheck, check_output

ORDERS = ("reference_first", "kernel_first")
# bound before any kernel is imported: a kernel that patches torch.equal does not blind the check
_EQUAL = torch.equal
_PROBLEM_OUTCOME = {
    "missing": Outcome.INCORRECT_SHAPE,
    "shape": Outcome.INCORRECT_SHAPE,
    "dtype": Outcome.INCORRECT_DTYPE,
    "nonfinite": Outcome.INCORRECT_NUMERICS,
    "tolerance": Outcome.INCORRECT_NUMERICS,
    "rms": Outcome.INCORRECT_NUMERICS,
}
# the order failures are reported in when several outputs fail differently
_SEVERITY = {"missing": 0, "shape": 1, "dtype": 2, "nonfinite": 3, "tolerance": 4, "rms": 5}


class Breach(Exception):
    """A check failed: carries the outcome and one line."""

    def __init__(self, outcome: Outcome, message: str, checks: list[OutputCheck] | None = None):
        super().__init__(message)
        self.outcome, self.message, self.checks = outcome, message, checks or []


def derive_seed(master: int, shape_index: int, trial: int) -> int:
    """A trial's input seed: unpredictable without the master seed, reproducible with it."""
    digest = hashlib.sha256(f"epiforge:{master}:{shape_index}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def is_compile_error(e: BaseException) -> bool:
    from primitives.epilogue import EpilogueError

    if isinstance(e, EpilogueError):
        return True
    lowering = sys.modules.get("primitives.lowering")
    if lowering is not None and isinstance(e, lowering.CompileError):
        return True
    mod = type(e).__module__ or ""
    return mod.startswith(("cutlass", "quack")) and "Runtime" not in type(e).__name__


def describe_exception(e: BaseException) -> tuple[Outcome, str]:
    """Outcome and one line for an exception raised by the kernel's code."""
    first = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    if is_compile_error(e):
        return Outcome.COMPILE_ERROR, first
    if isinstance(e, torch.OutOfMemoryError):
        return Outcome.RUNTIME_ERROR, f"device out of memory: {first}"
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "not enough memory" in str(e):
        return Outcome.RUNTIME_ERROR, f"out of memory (the worker's memory limit): {first}"
    if "illegal memory access" in str(e) or "CUDA error" in str(e):
        return Outcome.RUNTIME_ERROR, f"CUDA error (the worker's CUDA context is lost): {first}"
    return Outcome.RUNTIME_ERROR, first


# ---- values ---------------------------------------------------------------------------------


def _tensors(values) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in values.items():
        if isinstance(v, torch.Tensor):
            out[str(k)] = v
        elif isinstance(v, tuple):
            out.update({f"{k}[{i}]": x for i, x in enumerate(v) if isinstance(x, torch.Tensor)})
    return out


def snapshot(values) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in _tensors(values).items()}


def modified(before: dict[str, torch.Tensor], values) -> list[str]:
    """Names whose tensors differ bit for bit from the snapshot (NaN-safe)."""
    now = _tensors(values)
    bad = []
    for k, b in before.items():
        a = now.get(k)
        if a is None or a.shape != b.shape or a.dtype != b.dtype:
            bad.append(k)
        elif not _EQUAL(_bits(a), _bits(b)):
            bad.append(k)
    return bad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def freeze_prepared(prepared) -> MappingProxyType:
    """prepare()'s result, read-only: tensors and plain values only (a list or dict inside
    it would be state run() could keep between calls)."""
    if not isinstance(prepared, dict):
        raise Breach(Outcome.RUNTIME_ERROR, f"prepare() returned {type(prepared).__name__}, not a dict")

    def plain(v) -> bool:
        if isinstance(v, tuple):
            return all(plain(x) for x in v)
        return v is None or isinstance(v, (torch.Tensor, bool, int, float, str))

    for k, v in prepared.items():
        if not isinstance(k, str) or not plain(v):
            raise Breach(Outcome.RUNTIME_ERROR, f"prepare() returned {k!r}: {type(v).__name__}; only tensors, numbers, "
                                                "strings and tuples of them are allowed (no state between calls)")
    return MappingProxyType(dict(prepared))


def _storages(values) -> dict[int, str]:
    return {t.untyped_storage().data_ptr(): k for k, t in _tensors(values).items() if t.numel() > 0}


# ---- one trial ------------------------------------------------------------------------------


@dataclass
class Trial:
    outcome: Outcome
    message: str = ""
    checks: list[OutputCheck] = field(default_factory=list)
    outputs: dict | None = None


def references(task, inputs, dims) -> tuple[dict, dict]:
    return task.reference(inputs, dims, exact=True), task.reference(inputs, dims, exact=False)


def call_kernel(module, given: dict, prepared, device: str, guard: bool):
    """run() under poison (and on a CPU the compute guard); returns (outputs, violations)."""
    g = ComputeGuard(module.__file__) if guard else None
    with poisoned_allocations(), (g if g is not None else nullcontext()):
        outputs = module.run(given, prepared)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return outputs, (g.violations if g is not None else [])


def judge_outputs(task, outputs, exact: dict, lowprec: dict) -> Trial:
    """The tolerance rule on every output (after the structural checks)."""
    if not isinstance(outputs, dict):
        return Trial(Outcome.INCORRECT_SHAPE, f"run() returned {type(outputs).__name__}, not a dict of outputs")
    checks = [check_output(o, outputs.get(o.name), exact[o.name], lowprec[o.name]) for o in task.outputs]
    failed = sorted((c for c in checks if not c.ok), key=lambda c: _SEVERITY[c.problem])
    if failed:
        return Trial(_PROBLEM_OUTCOME[failed[0].problem], "; ".join(c.detail for c in failed), checks)
    extra = sorted(set(outputs) - {o.name for o in task.outputs})
    return Trial(Outcome.PASSED, f"unexpected extra outputs {extra} ignored" if extra else "", checks)


def run_trial(task, module, dims: dict, seed: int, device: str, order: str = "reference_first", *,
              guard: bool | None = None, tamper: TamperCheck | None = None, held: dict | None = None) -> Trial:
    """One checked call (see the module docstring). `held`: storages of outputs of earlier
    calls the caller still holds ({storage ptr: name}); the new outputs must not reuse them."""
    guard = (device == "cpu") if guard is None else guard
    inputs = task.make_inputs(dims, seed, device)
    if order == "reference_first":
        exact, lowprec = references(task, inputs, dims)
    consts = {t.name: inputs[t.name].clone() for t in task.inputs if t.constant}
    consts_before = snapshot(consts)
    given = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    try:
        prepared = freeze_prepared(module.prepare(consts) if hasattr(module, "prepare") else {})
        prepared_before = snapshot(prepared)
        outputs, violations = call_kernel(module, given, prepared, device, guard)
    except Breach as b:
        return Trial(b.outcome, b.message)
    except Exception as e:
        traceback.print_exc()
        outcome, line = describe_exception(e)
        return Trial(outcome, line)
    if order != "reference_first":
        exact, lowprec = references(task, inputs, dims)
    try:
        _structural_checks(task, inputs, given, consts_before, consts, prepared_before, prepared, outputs, violations,
                           tamper, held)
    except Breach as b:
        return Trial(b.outcome, b.message, outputs=outputs if isinstance(outputs, dict) else None)
    trial = judge_outputs(task, outputs, exact, lowprec)
    trial.outputs = outputs
    return trial


def _structural_checks(task, inputs, given, consts_before, consts, prepared_before, prepared, outputs, violations,
                       tamper, held) -> None:
    patched = tamper.changed() if tamper is not None else []
    if patched:  # first: a patched torch could blind the checks below
        raise Breach(Outcome.RUNTIME_ERROR, f"the kernel patched {patched[:5]}")
    bad = modified({k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}, given)
    if bad:
        raise Breach(Outcome.RUNTIME_ERROR, f"the kernel modified its input(s) {bad}")
    bad = modified(consts_before, consts)
    if bad:
        raise Breach(Outcome.RUNTIME_ERROR, f"prepare() modified the constant input(s) {bad}")
    bad = modified(prepared_before, prepared)
    if bad:
        raise Breach(Outcome.RUNTIME_ERROR, f"run() modified prepared {bad} (state between calls)")
    if violations:
        more = f" (+{len(violations) - 3} more)" if len(violations) > 3 else ""
        raise Breach(Outcome.EXTRA_LAUNCHES, "the kernel computed with torch outside the primitives: "
                                             f"{'; '.join(dict.fromkeys(violations[:3]))}{more} (each would be a "
                                             "separate kernel launch on the GPU)")
    if not isinstance(outputs, dict):
        return  # judged by judge_outputs
    theirs = {**_storages(given), **_storages(prepared)}
    for name, t in _tensors(outputs).items():
        if t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in theirs:
            raise Breach(Outcome.RUNTIME_ERROR, f"output {name!r} aliases {theirs[ptr]!r} (outputs must be new tensors)")
        if held and ptr in held:
            raise Breach(Outcome.RUNTIME_ERROR, f"output {name!r} reuses the storage of {held[ptr]} returned by an "
                                                "earlier call (outputs must be new tensors)")


# ---- one shape ------------------------------------------------------------------------------


def check_shape(task, module, shape, master_seed: int, shape_index: int, device: str, *,
                tamper: TamperCheck | None = None, trials: tuple[str, ...] = ORDERS) -> tuple[ShapeResult, dict | None]:
    """Trials in both orders on fresh inputs; returns the ShapeResult and the last outputs."""
    dims = shape.dims()
    held: dict[int, str] = {}
    keep = []  # earlier outputs stay alive, so a reuse of their storage is visible
    last = None
    for i, order in enumerate(trials):
        trial = run_trial(task, module, dims, derive_seed(master_seed, shape_index, i), device, order,
                          tamper=tamper, held=held)
        if trial.outcome != Outcome.PASSED:
            return ShapeResult(shape=shape.name, dims=dims, outcome=trial.outcome, outputs=trial.checks,
                               message=f"trial {i + 1} ({order.replace('_', ' ')}): {trial.message}", trials=i + 1), None
        last = trial
        keep.append(trial.outputs)
        held.update({p: f"trial {i + 1}'s {n!r}" for p, n in _storages(trial.outputs).items()})
    return ShapeResult(shape=shape.name, dims=dims, outcome=Outcome.PASSED, outputs=last.checks, message=last.message,
                       trials=len(trials)), last.outputs
