"""The correctness rule: compare a kernel's outputs with the task's two references, the
exact one and the low-precision one, whose error sets the allowance. The latter is what an
honest fused kernel computes (float32 GEMM accumulation and epilogue, one rounding per
output; tasks/spec.py Tolerance, after CODA v0.1's test rule), so a float32 output is held
to float32 accuracy and a bf16 output to about one rounding."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

import torch

from epiforge.tasks.spec import OutputSpec


class OutputCheck(BaseModel):
    """One output's verdict, with the worst element when it fails (a NaN stays NaN in JSON)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    name: str
    ok: bool
    problem: str | None = None  # "shape", "dtype", "nonfinite", "tolerance", "rms", "missing"
    max_error: float | None = None
    allowed: float | None = None
    rms_error: float | None = None
    rms_allowed: float | None = None
    worst_index: list[int] | None = None
    got: float | None = None
    expected: float | None = None
    detail: str = ""


def check_output(spec: OutputSpec, out, exact: torch.Tensor, lowprec: torch.Tensor) -> OutputCheck:
    """max|out - exact| <= factor * max|lowprec - exact| + atol, the same on the RMS error
    (rms_factor), and every element finite; lowprec is Task.reference(exact=False)."""
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
        self.low_max = self.err_max = self.sq_err = self.sq_low = 0.0
        self.count = 0
        self.worst = self.nonfinite = None

    def add(self, row0: int, out: torch.Tensor, exact: torch.Tensor, lowprec: torch.Tensor) -> None:
        got = out.detach().to(exact.device, torch.float64)
        ref = exact.to(torch.float64)
        low_err = lowprec.to(ref.device, torch.float64) - ref
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
        problem = ("tolerance" if self.err_max > allowed
                   else "rms" if rms_allowed is not None and rms_err > rms_allowed else None)
        got, expected = self.worst[1], self.worst[2]
        where = f"max error {self.err_max:.3e} at {idx} (got {got:.6g}, expected {expected:.6g}); allowed {allowed:.3e}"
        if problem == "rms":
            where = f"RMS error {rms_err:.3e} > allowed {rms_allowed:.3e} (a systematic error); " + where
        return OutputCheck(name=name, ok=problem is None, problem=problem, max_error=self.err_max, allowed=allowed,
                           rms_error=rms_err, rms_allowed=rms_allowed, worst_index=idx, got=got, expected=expected,
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
        return check_output(self.spec, out, self.exact, self.lowprec.to(self.spec.torch_dtype))
