"""The correctness rule: compare a kernel's outputs with the task's two references, the
exact one and the low-precision one, whose error sets the allowance. The latter is what an
honest fused kernel computes (float32 GEMM accumulation and epilogue, one rounding per
output; tasks/spec.py Tolerance, after CODA v0.1's test rule), so a float32 output is held
to float32 accuracy and a bf16 output to about one rounding, on its largest error, on its
RMS error and element by element."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

import torch

from epiforge.tasks.spec import OutputSpec


class OutputCheck(BaseModel):
    """One output's verdict, with the worst element when it fails (a NaN stays NaN in JSON)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    name: str
    ok: bool
    problem: str | None = None  # "shape", "dtype", "nonfinite", "tolerance", "rms", "element", "missing"
    max_error: float | None = None
    allowed: float | None = None
    rms_error: float | None = None
    rms_allowed: float | None = None
    element_excess: float | None = None  # max over elements of |out - ref| - factor * (honest error + ulp)
    element_allowed: float | None = None  # what that may reach: element_floor * unrounded RMS error + atol
    worst_index: list[int] | None = None
    got: float | None = None
    expected: float | None = None
    detail: str = ""


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at each value of x (float64): the gap between
    the two `dtype` numbers around |x|, the subnormal gap below the smallest normal."""
    fi = torch.finfo(dtype)
    _, exponent = torch.frexp(x)  # |x| in [2^(e-1), 2^e): the gap there is 2^(e-1) * eps
    gap = torch.ldexp(torch.full_like(x, fi.eps / 2), exponent)
    return torch.where(x == 0, 0.0, gap).clamp_min(fi.tiny * fi.eps)


def check_output(spec: OutputSpec, out, exact: torch.Tensor, lowprec: torch.Tensor) -> OutputCheck:
    """max|out - exact| <= factor * max|lowprec - exact| + atol, the same on the RMS error
    (rms_factor), element by element (element_floor: tasks/spec.py Tolerance), and every
    element finite. lowprec is Task.reference(exact=False): unrounded (float32, rounded=False,
    what the judge passes), or rounded to the output's dtype, whose error then stands for the
    unrounded one in the element rule's floor (larger for a 16-bit output: a looser floor)."""
    name = spec.name
    if not isinstance(out, torch.Tensor):
        return OutputCheck(name=name, ok=False, problem="missing", detail=f"{name} missing or not a tensor")
    if tuple(out.shape) != tuple(exact.shape):
        return OutputCheck(name=name, ok=False, problem="shape",
                           detail=f"{name}: shape {tuple(out.shape)}, expected {tuple(exact.shape)}")
    if out.dtype != spec.torch_dtype:
        return OutputCheck(name=name, ok=False, problem="dtype",
                           detail=f"{name}: dtype {out.dtype}, expected {spec.torch_dtype}")
    return check_output_rows(spec, tuple(out.shape), [(0, out, exact, lowprec)])


def check_output_rows(spec: OutputSpec, shape: tuple[int, ...], pieces) -> OutputCheck:
    """check_output's verdict for an output (of `shape`, its dtype checked) given as blocks
    of whole rows, so that references too large for memory at once can be made block by
    block: `pieces` yields (first row, out, exact, lowprec) for consecutive blocks in row
    order. The same verdict, worst element and numbers as check_output on the whole."""
    rows = RowsCheck(spec, shape)
    for piece in pieces:
        rows.add(*piece)
    return rows.result()


class RowsCheck:
    """check_output_rows fed one block at a time (`add`, then `result`), for several outputs
    whose blocks come from one reference call."""

    def __init__(self, spec: OutputSpec, shape: tuple[int, ...]):
        self.spec, self.shape = spec, tuple(shape)
        self.row_size = 1
        for n in self.shape[1:]:
            self.row_size *= n
        self.low_max = self.err_max = self.sq_err = self.sq_low = self.sq_unrounded = 0.0
        self.count = 0
        self.worst = self.nonfinite = self.element_worst = None

    def add(self, row0: int, out: torch.Tensor, exact: torch.Tensor, lowprec: torch.Tensor) -> None:
        """A block of rows; lowprec as check_output takes it (unrounded, or in the output's dtype)."""
        dtype = self.spec.torch_dtype
        got = out.detach().to(exact.device, torch.float64)
        ref = exact.to(torch.float64)
        low = lowprec.to(ref.device)
        unrounded_err = low.to(torch.float64) - ref
        low_err = unrounded_err if low.dtype == dtype else low.to(dtype).to(torch.float64) - ref
        self.sq_unrounded += unrounded_err.pow(2).sum().item()
        del unrounded_err
        self.low_max = max(self.low_max, low_err.abs().max().item())
        self.sq_low += low_err.pow(2).sum().item()
        self.count += got.numel()
        bad = ~torch.isfinite(got)
        if self.nonfinite is None and bad.any():
            flat = int(bad.flatten().nonzero()[0])
            self.nonfinite = (row0 * self.row_size + flat, float(got.flatten()[flat]), float(ref.flatten()[flat]))
        if self.nonfinite is not None:
            return
        err = (got - ref).abs()
        flat = int(err.flatten().argmax())
        if self.worst is None or float(err.flatten()[flat]) > self.err_max:
            self.err_max = float(err.flatten()[flat])
            self.worst = (row0 * self.row_size + flat, float(got.flatten()[flat]), float(ref.flatten()[flat]))
        self.sq_err += err.pow(2).sum().item()
        if self.spec.tolerance.element_floor is not None:
            # the element rule's left side, less its per-element allowance (the floor is global: result())
            excess = err.sub_(low_err.abs_().add_(ulp(ref, self.spec.torch_dtype)).mul_(self.spec.tolerance.factor))
            flat = int(excess.flatten().argmax())
            if self.element_worst is None or float(excess.flatten()[flat]) > self.element_worst[3]:
                self.element_worst = (row0 * self.row_size + flat, float(got.flatten()[flat]),
                                      float(ref.flatten()[flat]), float(excess.flatten()[flat]))

    def result(self) -> OutputCheck:
        name, tol = self.spec.name, self.spec.tolerance
        allowed = tol.factor * self.low_max + tol.atol

        def index(flat: int) -> list[int]:
            return [int(i) for i in torch.unravel_index(torch.tensor(flat), self.shape)]

        if self.nonfinite is not None:
            idx = index(self.nonfinite[0])
            return OutputCheck(name=name, ok=False, problem="nonfinite", allowed=allowed, worst_index=idx,
                               got=self.nonfinite[1], expected=self.nonfinite[2],
                               detail=f"{name}: non-finite value at {idx}")
        idx = index(self.worst[0])
        rms_err = (self.sq_err / self.count) ** 0.5
        rms_allowed = None if tol.rms_factor is None else tol.rms_factor * (self.sq_low / self.count) ** 0.5 + tol.atol
        excess = element_allowed = None
        if self.element_worst is not None:
            excess = self.element_worst[3]
            element_allowed = tol.element_floor * (self.sq_unrounded / self.count) ** 0.5 + tol.atol
        problem = ("tolerance" if self.err_max > allowed
                   else "rms" if rms_allowed is not None and rms_err > rms_allowed
                   else "element" if excess is not None and excess > element_allowed else None)
        got, expected = self.worst[1], self.worst[2]
        where = f"max error {self.err_max:.3e} at {idx} (got {got:.6g}, expected {expected:.6g}); allowed {allowed:.3e}"
        if problem == "rms":
            where = f"RMS error {rms_err:.3e} > allowed {rms_allowed:.3e} (a systematic error); " + where
        if problem == "element":
            idx = index(self.element_worst[0])
            got, expected = self.element_worst[1], self.element_worst[2]
            rms_text = "" if rms_allowed is None else f" and the RMS error's {rms_allowed:.3e}"
            where = (f"the element at {idx} is {got:.6g}, expected {expected:.6g}: off by {abs(got - expected):.3e}, "
                     f"{excess:.3e} more than {tol.factor:g} x (its honest error + one {self.spec.dtype} unit), where "
                     f"{element_allowed:.3e} is allowed (a value wrong where values are small; the max error's allowance "
                     f"{allowed:.3e}{rms_text} let it through)")
        return OutputCheck(name=name, ok=problem is None, problem=problem, max_error=self.err_max, allowed=allowed,
                           rms_error=rms_err, rms_allowed=rms_allowed, element_excess=excess,
                           element_allowed=element_allowed, worst_index=idx, got=got, expected=expected,
                           detail=f"{name}: {where}")


class SumCheck:
    """check_output for an output that sums per-token terms over the rows
    (OutputSpec.sum_over_rows), its references given as the partial sums of blocks of rows
    (`add`, then `result`). The exact partials are added in float64; the low-precision ones
    come unrounded (float32, Task.reference(rounded=False)), are added in float64 and
    rounded once to the output's dtype, as a kernel accumulating every row in float32
    rounds once. Adding the blocks' float32 sums in float64 errs a little less than one
    float32 sum over all rows, so the allowance is if anything tighter than on the whole."""

    def __init__(self, spec: OutputSpec, shape: tuple[int, ...]):
        self.spec = spec
        self.exact = torch.zeros(shape, dtype=torch.float64)
        self.lowprec = torch.zeros(shape, dtype=torch.float64)

    def add(self, exact: torch.Tensor, lowprec: torch.Tensor) -> None:
        if lowprec.dtype != torch.float32:
            raise ValueError(f"{self.spec.name}: the low-precision partial sum must come unrounded (float32), "
                             f"not {lowprec.dtype}")
        self.exact.add_(exact.to(self.exact.device))
        self.lowprec.add_(lowprec.to(self.lowprec.device))

    def result(self, out) -> OutputCheck:
        return check_output(self.spec, out, self.exact, self.lowprec)  # unrounded: check_output rounds it once
