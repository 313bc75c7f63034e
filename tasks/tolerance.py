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
    got = out.detach().to(exact.device, torch.float64)
    ref = exact.to(torch.float64)
    tol = spec.tolerance
    low_err = lowprec.to(ref.device, torch.float64) - ref
    allowed = tol.factor * low_err.abs().max().item() + tol.atol
    bad = ~torch.isfinite(got)
    if bad.any():
        flat = int(bad.flatten().nonzero()[0])
        idx = list(torch.unravel_index(torch.tensor(flat), got.shape))
        idx = [int(i) for i in idx]
        return OutputCheck(name=name, ok=False, problem="nonfinite", allowed=allowed, worst_index=idx,
                           got=float(got.flatten()[flat]), expected=float(ref.flatten()[flat]),
                           detail=f"{name}: non-finite value at {idx}")
    err = (got - ref).abs()
    flat = int(err.flatten().argmax())
    max_err = float(err.flatten()[flat])
    idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), got.shape)]
    rms_err = err.pow(2).mean().sqrt().item()
    rms_allowed = None if tol.rms_factor is None else tol.rms_factor * low_err.pow(2).mean().sqrt().item() + tol.atol
    problem = "tolerance" if max_err > allowed else "rms" if rms_allowed is not None and rms_err > rms_allowed else None
    where = (f"max error {max_err:.3e} at {idx} (got {float(got.flatten()[flat]):.6g}, "
             f"expected {float(ref.flatten()[flat]):.6g}); allowed {allowed:.3e}")
    if problem == "rms":
        where = f"RMS error {rms_err:.3e} > allowed {rms_allowed:.3e} (a systematic error); " + where
    return OutputCheck(
        name=name, ok=problem is None, problem=problem, max_error=max_err, allowed=allowed, rms_error=rms_err,
        rms_allowed=rms_allowed, worst_index=idx, got=float(got.flatten()[flat]), expected=float(ref.flatten()[flat]),
        detail=f"{name}: {where}",
    )
