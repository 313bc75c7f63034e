"""Numerics, in the judge: checked calls of a kernel (in its runner) on fresh inputs.

One trial = fresh inputs from a seed derived from the secret master seed (they stay in
the judge; the runner gets shared copies), the references (float64 "exact" and the
honest-fused low-precision one, which sets the allowance: tasks/tolerance.py), prepare()
and run() in the runner, and these checks, in this order:
  the runner's own report (an exception, patched torch,
  outputs aliasing an input or an earlier output)   its outcome (RUNTIME_ERROR, COMPILE_ERROR ...)
  the shared inputs or constants modified           RUNTIME_ERROR   (compared here, with the judge's copy)
  not a dict / an output missing or misshapen,
  on another device, or not row-major contiguous    INCORRECT_SHAPE
  wrong dtype                                       INCORRECT_DTYPE
  NaN/Inf or outside the tolerance rule (max, RMS,
  element by element: tasks/tolerance.py)           INCORRECT_NUMERICS (worst element)
  CPU: torch compute outside primitives, or other
  launches than the task's fused GEMMs + its named
  finishing steps (primitives/trace.py)             EXTRA_LAUNCHES  (after the values, as on the GPU)
The values judged are the judge's own buffers, which the runner filled and which start
as NaN. Each shape runs two trials: the reference computed before the kernel, then the
kernel before the reference.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field

import torch

from epiforge.eval import channel
from epiforge.eval.launches import classify_recorded
from epiforge.eval.remote import Delivered, KernelFailure, KernelProcess
from epiforge.eval.result import Outcome, ShapeResult
from epiforge.tasks.spec import TaskCodeError
from epiforge.tasks.tolerance import OutputCheck, check_output

ORDERS = ("reference_first", "kernel_first")
_PROBLEM_OUTCOME = {
    "missing": Outcome.INCORRECT_SHAPE,
    "shape": Outcome.INCORRECT_SHAPE,
    "device": Outcome.INCORRECT_SHAPE,
    "layout": Outcome.INCORRECT_SHAPE,
    "dtype": Outcome.INCORRECT_DTYPE,
    "nonfinite": Outcome.INCORRECT_NUMERICS,
    "tolerance": Outcome.INCORRECT_NUMERICS,
    "rms": Outcome.INCORRECT_NUMERICS,
    "element": Outcome.INCORRECT_NUMERICS,
}
# the order failures are reported in when several outputs fail differently
_SEVERITY = {"missing": 0, "shape": 1, "device": 2, "layout": 3, "dtype": 4, "nonfinite": 5, "tolerance": 6, "rms": 7, "element": 8}


def derive_seed(master: int, shape_index: int, trial: int) -> int:
    """A trial's input seed: unpredictable without the master seed, reproducible with it."""
    digest = hashlib.sha256(f"epiforge:{master}:{shape_index}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


#: the mainloop GEMM's error is believed up to this many times cuBLAS's (a wrong mainloop
#: must not widen the allowance: the exact reference, not quack, decides what is right)
MAINLOOP_ERROR_CAP = 4.0


def references(task, inputs, dims) -> tuple[dict, dict]:
    """The exact reference and the low-precision one whose error sets the allowance, the
    latter unrounded (float32: tasks/tolerance.check_output rounds it to each output's dtype
    and reads the error before that rounding too, for its element rule's floor). On a
    GPU the latter is computed twice, with cuBLAS's GEMM and with the fixed mainloop's
    (quack's GEMM with nothing fused, which an honest fused kernel's accumulator is), and
    each output keeps the one of larger error, the mainloop's believed up to
    MAINLOOP_ERROR_CAP times cuBLAS's. Tensor cores accumulate with truncation, so the
    error grows with the length of a K chain; cuBLAS splits K at small M, the mainloop
    never does. Measured: on the H200 the expert k6's dw (a column sum over M of a GEMM's
    output) was 1.31 times its cuBLAS-based allowance at a hidden smoke shape."""
    exact = task.reference(inputs, dims, exact=True)
    lowprec = task.reference(inputs, dims, exact=False, rounded=False)
    if not any(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs.values()):
        return exact, lowprec
    try:
        mainloop = task.reference(inputs, dims, exact=False, mm=mainloop_mm, rounded=False)
    except (TaskCodeError, torch.cuda.OutOfMemoryError, MemoryError):
        raise
    except Exception as e:  # the mainloop GEMM did not build or run: cuBLAS's allowance alone
        print(f"references: the mainloop GEMM failed ({type(e).__name__}: {str(e)[:200]}); "
              "the allowance comes from cuBLAS's GEMM alone", file=sys.stderr)
        return exact, lowprec
    return exact, larger_honest_error(exact, lowprec, mainloop, {o.name: o.torch_dtype for o in task.outputs})


def larger_honest_error(exact: dict, cublas: dict, mainloop: dict, dtypes: dict | None = None) -> dict:
    """Per output, the low-precision reference of larger max error (once rounded to the
    output's dtype in `dtypes`, where given): the mainloop's where it errs more than
    cuBLAS's but at most MAINLOOP_ERROR_CAP times as much, else cuBLAS's."""
    out = dict(cublas)
    for name, ref in exact.items():
        ref = ref.double()
        dt = (dtypes or {}).get(name)
        cublas_err = ((cublas[name] if dt is None else cublas[name].to(dt)).double() - ref).abs().max().item()
        mainloop_err = ((mainloop[name] if dt is None else mainloop[name].to(dt)).double() - ref).abs().max().item()
        if cublas_err < mainloop_err <= MAINLOOP_ERROR_CAP * cublas_err:
            out[name] = mainloop[name]
    return out


def mainloop_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (b as (k, n)) by the fixed mainloop: quack's SM90 GEMM with an identity
    epilogue and a float32 D (any tile config accumulates K in the same order); other
    operands go to tasks.common.mm."""
    from epiforge.tasks import common

    # a task of several GEMMs hands its stored intermediates as float32 tensors of 16-bit values
    # (common.stored_as): the GEMM reads them in the other operand's 16-bit dtype
    half = next((t.dtype for t in (a, b) if t.dtype in (torch.bfloat16, torch.float16)), None)
    if half is not None:
        a, b = (_exactly_in(t, half) for t in (a, b))
    if not (a.is_cuda and a.dim() == b.dim() == 2 and a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)):
        return common.mm(a, b)
    from epiforge.eval.baselines import identity_gemm

    return identity_gemm(a, b.T, dtypes={"D": torch.float32})["D"]


def _exactly_in(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype` where that changes no value (a float32 tensor of stored 16-bit values)."""
    if t.dtype == torch.float32:
        narrow = t.to(dtype)
        if torch.equal(narrow.float(), t):
            return narrow
    return t


# ---- shared tensors -------------------------------------------------------------------------


@dataclass
class InputSet:
    """One set of inputs: the judge's private copy, and the shared copy the runner reads."""

    name: str
    private: dict
    shared: dict[str, torch.Tensor]
    refs: list[dict]
    fds: list[int]
    scalars: dict

    def put(self, kp: KernelProcess, stage: str) -> None:
        try:
            kp.ask({"op": "put", "set": self.name, "tensors": self.refs, "scalars": self.scalars}, self.fds, stage=stage)
        finally:
            close_fds(self.fds)
            self.fds = []

    def modified(self, names=None) -> list[str]:
        """Inputs whose shared copy no longer equals the judge's bit for bit."""
        return [k for k, t in self.shared.items() if (names is None or k in names)
                and not torch.equal(_bits(t), _bits(self.private[k]))]


def make_input_set(name: str, task, inputs: dict, device: str) -> InputSet:
    shared, refs, fds = {}, [], []
    for spec in task.inputs:
        t = inputs[spec.name]
        s, fd = channel.shared_empty(t.shape, t.dtype, device)
        s.copy_(t)
        shared[spec.name] = s
        refs.append(channel.describe(spec.name, s, fd, len(fds) if fd is not None else None).model_dump())
        if fd is not None:
            fds.append(fd)
    if device == "cuda":
        torch.cuda.synchronize()
    scalars = {s.name: inputs[s.name] for s in task.scalars}
    return InputSet(name=name, private=inputs, shared=shared, refs=refs, fds=fds, scalars=scalars)


@dataclass
class OutputBuffers:
    """The judge's buffers for a call's outputs, NaN (ints: their maximum) until filled."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_task(cls, task, dims, device: str) -> "OutputBuffers":
        bufs = cls()
        for o in task.outputs:
            t, fd = channel.shared_empty(o.concrete_shape(dims), o.torch_dtype, device)
            bufs.tensors[o.name] = t
            if fd is not None:
                bufs.fds[o.name] = fd
        bufs.poison()
        return bufs

    def poison(self) -> None:
        for t in self.tensors.values():
            t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).max)
        if any(t.is_cuda for t in self.tensors.values()):
            torch.cuda.synchronize()  # done before the runner writes into them

    def wire(self) -> tuple[list[dict], list[int]]:
        """(TensorRefs, fds) for one message (the fds stay open here for the next one)."""
        refs, fds = [], []
        for name, t in self.tensors.items():
            fd = self.fds.get(name)
            refs.append(channel.describe(name, t, fd, len(fds) if fd is not None else None).model_dump())
            if fd is not None:
                fds.append(fd)
        return refs, fds

    def close(self) -> None:
        close_fds(list(self.fds.values()))
        self.fds = {}


def close_fds(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


# ---- one trial ------------------------------------------------------------------------------


@dataclass
class Trial:
    outcome: Outcome
    message: str = ""
    checks: list[OutputCheck] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)  # the runner's record of primitive calls


def judge_delivery(task, delivered: Delivered, dims: dict, bufs: OutputBuffers, exact: dict, lowprec: dict) -> Trial:
    """Structure first, then the tolerance rule on the values in the judge's buffers."""
    if delivered.returned != "dict":
        return Trial(Outcome.INCORRECT_SHAPE, f"run() returned {delivered.returned}, not a dict of outputs")
    checks = []
    for o in task.outputs:
        seen = delivered.outputs.get(o.name)
        want = list(o.concrete_shape(dims))
        if seen is None or seen.kind != "tensor":
            what = "missing" if seen is None or seen.kind == "missing" else f"a {seen.kind}, not a tensor"
            checks.append(OutputCheck(name=o.name, ok=False, problem="missing", detail=f"{o.name} {what}"))
        elif seen.shape != want:
            checks.append(OutputCheck(name=o.name, ok=False, problem="shape",
                                      detail=f"{o.name}: shape {tuple(seen.shape or ())}, expected {tuple(want)}"))
        elif seen.dtype != o.dtype:
            checks.append(OutputCheck(name=o.name, ok=False, problem="dtype",
                                      detail=f"{o.name}: dtype {seen.dtype}, expected {o.dtype}"))
        elif not seen.copied:
            checks.append(OutputCheck(name=o.name, ok=False, problem="device",
                                      detail=f"{o.name}: on {seen.device}, expected the inputs' device"))
        elif not seen.contiguous:  # every output's layout (tasks/spec.py TensorSpec.layout): row-major, contiguous
            checks.append(OutputCheck(name=o.name, ok=False, problem="layout",
                                      detail=f"{o.name}: strides {seen.stride} are not row-major contiguous (the right "
                                             "values in another layout are still a wrong output)"))
        else:
            checks.append(check_output(o, bufs.tensors[o.name], exact[o.name], lowprec[o.name]))
    failed = sorted((c for c in checks if not c.ok), key=lambda c: _SEVERITY[c.problem])
    if failed:
        return Trial(_PROBLEM_OUTCOME[failed[0].problem], "; ".join(c.detail for c in failed), checks)
    return Trial(Outcome.PASSED, f"unexpected extra outputs {delivered.extra} ignored" if delivered.extra else "", checks)


def launch_trial(task, delivered: Delivered, device: str) -> Trial | None:
    """The CPU's launch check on one call (the GPU's is the profiler's, eval/gpu_stages.py)."""
    if device != "cpu":
        return None
    if delivered.violations:
        v = list(dict.fromkeys(delivered.violations))
        more = f" (+{len(v) - 3} more)" if len(v) > 3 else ""
        return Trial(Outcome.EXTRA_LAUNCHES, f"the kernel computed with torch outside the primitives: {'; '.join(v[:3])}"
                                             f"{more} (each would be a separate kernel launch on the GPU)")
    ok, line = classify_recorded(delivered.launched, task.launches)
    return None if ok else Trial(Outcome.EXTRA_LAUNCHES, line)


def run_trial(task, kp: KernelProcess, dims: dict, seed: int, device: str, order: str, set_name: str) -> Trial:
    """One checked call (see the module docstring)."""
    inputs = task.make_inputs(dims, seed, device)
    exact = lowprec = None
    if order == "reference_first":
        exact, lowprec = references(task, inputs, dims)
    iset = make_input_set(set_name, task, inputs, device)
    bufs = OutputBuffers.for_task(task, dims, device)
    consts = [t.name for t in task.inputs if t.constant]
    try:
        iset.put(kp, "numerics")
        kp.ask({"op": "prepare", "set": set_name, "consts": consts}, stage="numerics")
        bad = iset.modified(consts)
        if bad:
            return Trial(Outcome.RUNTIME_ERROR, f"prepare() modified the constant input(s) {bad}")
        refs, fds = bufs.wire()
        frame = kp.ask({"op": "call", "set": set_name, "outputs": refs}, fds, stage="numerics")
        delivered = kp.parse(Delivered, frame, "numerics")
        kp.ask({"op": "drop", "set": set_name}, stage="numerics")
    except KernelFailure as f:
        return Trial(Outcome(f.outcome), f.message)
    finally:
        bufs.close()
    bad = iset.modified()
    if bad:
        return Trial(Outcome.RUNTIME_ERROR, f"the kernel modified its input(s) {bad}")
    if order != "reference_first":
        exact, lowprec = references(task, inputs, dims)
    verdict = judge_delivery(task, delivered, dims, bufs, exact, lowprec)
    verdict.launched = list(delivered.launched)
    if verdict.outcome != Outcome.PASSED:
        return verdict
    # values first, launches second: the order the GPU's stages run in
    return launch_trial(task, delivered, device) or verdict


# ---- one shape ------------------------------------------------------------------------------


def check_shape(task, kp: KernelProcess, shape, master_seed: int, shape_index: int, device: str, *,
                hidden: bool = False, trials: tuple[str, ...] = ORDERS) -> ShapeResult:
    """Trials in both orders on fresh inputs."""
    dims = shape.dims()
    last = None
    for i, order in enumerate(trials):
        trial = run_trial(task, kp, dims, derive_seed(master_seed, shape_index, i), device, order,
                          f"s{shape_index}t{i}")
        if trial.outcome != Outcome.PASSED:
            res = ShapeResult(shape=shape.name, dims=dims, outcome=trial.outcome, outputs=trial.checks,
                              message=f"trial {i + 1} ({order.replace('_', ' ')}): {trial.message}", trials=i + 1)
            return withhold(res) if hidden else res
        last = trial
    configs = sorted({x.rsplit("@", 1)[1] for x in last.launched if x.startswith("gemm:") and "@" in x})
    res = ShapeResult(shape=shape.name, dims=dims, outcome=Outcome.PASSED, outputs=last.checks, message=last.message,
                      trials=len(trials), gemm_configs=configs)
    return withhold(res) if hidden else res


def withhold(res: ShapeResult) -> ShapeResult:
    """A hidden shape's result says how far off it was, never where or at which dims."""
    checks = []
    for c in res.outputs:
        detail = (f"{c.name}: ok" if c.ok else
                  f"{c.name}: {c.problem}" + (f": max error {c.max_error:.3e}, allowed {c.allowed:.3e}"
                                               if c.max_error is not None and c.allowed is not None else "")
                  + (f"; RMS error {c.rms_error:.3e}, allowed {c.rms_allowed:.3e}"
                     if c.problem == "rms" and c.rms_error is not None and c.rms_allowed is not None else "")
                  + (f"; an element {c.element_excess:.3e} beyond its own allowance, {c.element_allowed:.3e} allowed"
                     if c.problem == "element" and c.element_excess is not None and c.element_allowed is not None else ""))
        checks.append(c.model_copy(update={"worst_index": None, "got": None, "expected": None, "detail": detail}))
    if res.outcome == Outcome.PASSED:
        message = res.message
    elif res.outcome in (Outcome.INCORRECT_NUMERICS, Outcome.INCORRECT_SHAPE, Outcome.INCORRECT_DTYPE):
        failed = [c.detail for c in checks if not c.ok]
        message = "a hidden shape failed (its dims are withheld): " + ("; ".join(failed) or res.outcome.value)
    else:  # the judge's own words: an error's text is the kernel's, and may spell the dims in any form
        message = (f"a hidden shape failed (its dims are withheld, and so is what the kernel's process said there): "
                   f"{res.outcome.value} in trial {res.trials}")
    return res.model_copy(update={"shape": "hidden", "dims": {}, "hidden": True, "outputs": checks, "message": message})


def mask_numbers(text: str) -> str:
    """Every number of two digits or more as N (what a hidden shape's failure may quote),
    except a traceback's line numbers."""
    return re.sub(r"(?<!line )(?<![\w.])\d{2,}", "N", text)
