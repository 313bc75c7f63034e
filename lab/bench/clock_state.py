"""Is a fused kernel's ratio to GEMM-only a property of the GPU's state? One process times
each expert kernel (at its TUNED pick) and the judge's GEMM-only candidates
(eval.baselines.gemm_candidates) under several timing regimes, one after another:

  back-to-back            lab/bench/'s procedure (eval.timing.time_cuda_interleaved): each call
                          queued behind the last, the GPU never idle, so at its power cap
  synced:LEAD             the judge's procedure (eval.timing.timed_call): one synchronized
                          call after LEAD ("spin", "heat:<ms>"), in a fresh random order
  synced:LEAD+gap:MS      the same with the host idle MS ms after each call, as the judge's
                          process is between calls (IPC, input refresh, checks)

Within a regime the ratio fused / GEMM-only is taken repetition by repetition
(eval.stats.paired_ratio); the GPU's clocks are sampled over each regime. If the ratio moves
with the regime in one process, the judge (compare) and lab/bench/ disagree because of the GPU
state they time in, not because of the judge's process split.

    python -m lab.bench.clock_state --tasks k7 k6 k1 --scales 7B --out clock-state.json
    python -m lab.bench.clock_state --report clock-state.json
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from epiforge.eval.clocks import ClockSummary
from epiforge.eval.stats import Ratio, Timing

DEFAULT_REGIMES = ["back-to-back", "synced:spin", "synced:heat:3", "synced:spin+gap:2", "back-to-back"]


class Regime(BaseModel):
    """One timing procedure, parsed from its name."""

    name: str
    lead: str | None = Field(None, description="synced: eval.timing.Lead's text; None: back-to-back")
    gap_ms: float = Field(0.0, ge=0.0, le=100.0, description="host idle time after each synced call")

    @classmethod
    def parse(cls, text: str) -> "Regime":
        from epiforge.eval.timing import Lead

        if text == "back-to-back":
            return cls(name=text)
        kind, _, rest = text.partition(":")
        lead, _, gap = rest.partition("+gap:")
        if kind != "synced" or not lead:
            raise ValueError(f"regime {text!r}: use back-to-back, synced:LEAD or synced:LEAD+gap:MS")
        try:
            Lead.parse(lead)
        except ValueError:
            raise ValueError(f"regime {text!r}: the lead is 'spin' or 'heat:<ms>' with 0.5 <= ms <= 100") from None
        try:
            gap_ms = float(gap) if gap else 0.0
        except ValueError:
            raise ValueError(f"regime {text!r}: the gap is not a number of ms") from None
        return cls(name=text, lead=lead, gap_ms=gap_ms)


class RegimeTiming(BaseModel):
    """The kernel and the plain GEMMs of one row under one regime (one interleaved run)."""

    regime: str
    fused_over_gemm_only: Ratio = Field(description="per-repetition fused / the fastest plain GEMM")
    gemm_only: str = Field(description="which plain GEMM was the fastest (eval.stats.fastest, cuBLAS the reference)")
    fused: Timing
    gemms: dict[str, Timing] = Field(description="every plain GEMM candidate, cuBLAS included")
    clocks: ClockSummary | None = None


class ClockStateRow(BaseModel):
    task: str
    shape: str
    gemm_mnk: tuple[int, int, int]
    config: str = Field(description="the config the kernel picked from its TUNED table")
    regimes: list[RegimeTiming]


class ClockStateReport(BaseModel):
    environment: dict
    reps: int
    rows: list[ClockStateRow]


def _synced(fns: dict, reps: int, regime: Regime) -> dict[str, Timing]:
    """Each repetition times every function once with timed_call (the judge's procedure), in
    a fresh seeded random order, the host idle gap_ms after each call."""
    from epiforge.eval.stats import summarize
    from epiforge.eval.timing import Lead, gpu_clocks, timed_call

    lead = Lead.parse(regime.lead)
    order = random.Random(len(fns) * 7919 + reps)
    names = list(fns)
    samples = {n: [] for n in names}
    for name in names:  # warm-up, as the judge's
        for j in range(3):
            timed_call(lambda: fns[name](j % 2), lead=lead)
    with gpu_clocks() as clocks:
        for i in range(reps):
            for name in order.sample(names, len(names)):
                samples[name].append(timed_call(lambda: fns[name](i % 2), lead=lead))
                if regime.gap_ms:
                    time.sleep(regime.gap_ms / 1000.0)
    summary = clocks.summary()
    return {n: summarize(samples[n], keep=True, clocks=summary) for n in names}


def measure_row(task, module, shape, regimes: list[Regime], reps: int) -> ClockStateRow:
    import torch

    from epiforge import primitives as P
    from epiforge.eval.baselines import gemm_candidates
    from epiforge.eval.stats import fastest, paired_ratio
    from epiforge.eval.timing import time_cuda_interleaved

    dims = shape.dims()
    sets = [task.make_inputs(dims, seed=100 + i, device="cuda") for i in range(2)]
    consts = {t.name: sets[0][t.name] for t in task.inputs if t.constant}
    prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
    operands = [task.gemm_operand_sets(s, dims) for s in sets]  # one (A, B) per set: a task of one GEMM
    config = P.pick_config(getattr(module, "TUNED", {}), *operands[0][0])
    plain, _ = gemm_candidates(task, dims, operands, [config], "cuda")
    fns = {"fused": lambda j: module.run(sets[j], prepared, config=None), **plain}
    timed = []
    for regime in regimes:
        if regime.lead is None:
            t = time_cuda_interleaved({n: (f, [(0,), (1,)]) for n, f in fns.items()}, reps=reps)
        else:
            t = _synced(fns, reps, regime)
        gemms = {n: t[n] for n in plain}
        best = fastest(gemms, t["cublas"])
        timed.append(RegimeTiming(regime=regime.name, fused_over_gemm_only=paired_ratio(t["fused"], t[best]),
                                  gemm_only=best, fused=t["fused"], gemms=gemms, clocks=t["fused"].clocks))
    torch.cuda.empty_cache()
    return ClockStateRow(task=task.name, shape=shape.name, gemm_mnk=task.gemm_shape(dims), config=config.key(),
                         regimes=timed)


def render(report: ClockStateReport) -> str:
    """A markdown table per row: each regime's ratio, its GEMM-only pick, the cuBLAS and fused
    medians relative to the first regime's, and the clocks."""
    env = report.environment
    lines = [f"{env.get('gpu', '?')}, driver {env.get('driver', '?')}, commit {env.get('commit', '?')}, "
             f"{env.get('date', '?')}; `{env.get('command', '?')}`; {report.reps} repetitions per regime", ""]
    for row in report.rows:
        first = row.regimes[0]
        lines += [f"**{row.task} {row.shape}** (GEMM {'x'.join(map(str, row.gemm_mnk))}, kernel at {row.config})", "",
                  "| regime | fused / GEMM-only | GEMM-only | cuBLAS time / first | fused time / first | SM MHz | power-capped |",
                  "|---|---|---|---|---|---|---|"]
        for r in row.regimes:
            ratio = r.fused_over_gemm_only
            c = r.clocks
            mhz = f"{c.sm_mhz_median:.0f} ({c.sm_mhz_min:.0f}-{c.sm_mhz_max:.0f})" if c and c.sm_mhz_median else "-"
            capped = f"{c.power_capped_share:.0%}" if c and c.power_capped_share is not None else "-"
            cub = r.gemms["cublas"].median_us / first.gemms["cublas"].median_us
            fused = r.fused.median_us / first.fused.median_us
            lines.append(f"| {r.regime} | {ratio.median:.3f} [{ratio.q1:.3f}, {ratio.q3:.3f}] | {r.gemm_only} | "
                         f"{cub:.3f} | {fused:.3f} | {mhz} | {capped} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.clock_state")
    ap.add_argument("--tasks", nargs="*", default=["k7", "k6", "k1"], help="task ids (default: k7 k6 k1)")
    ap.add_argument("--scales", nargs="*", default=["7B"], help="paper shapes (default: 7B)")
    ap.add_argument("--regimes", nargs="*", default=DEFAULT_REGIMES,
                    help=f"in this order (default: {' '.join(DEFAULT_REGIMES)})")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per regime (default: 30)")
    ap.add_argument("--out", help="the JSON to write (required unless --report)")
    ap.add_argument("--report", help="print the markdown of a written JSON instead of measuring")
    args = ap.parse_args(argv)
    if args.report:
        try:
            report = ClockStateReport.model_validate_json(Path(args.report).read_text())
        except (OSError, ValueError) as e:
            ap.error(f"--report {args.report}: not a clock_state result ({str(e).splitlines()[0]})")
        print(render(report))
        return 0
    if not args.out:
        ap.error("--out is required (or --report FILE)")
    if args.reps < 5:
        ap.error("--reps must be at least 5")
    try:
        regimes = [Regime.parse(r) for r in args.regimes]
    except ValueError as e:
        ap.error(str(e).splitlines()[0])
    from epiforge import tasks
    from lab.bench.gpu_env import fingerprint, write_report
    from epiforge.eval.machine import command_line
    from epiforge.eval.precompiled import install_precompiled
    from epiforge.eval.kernel import expert_kernel, load_kernel_module

    catalogue = {t.id: t for t in tasks.load_catalogue()[0]}
    unknown = [t for t in args.tasks if t not in catalogue or expert_kernel(catalogue[t].name) is None]
    if unknown:
        ap.error(f"--tasks {' '.join(unknown)}: no such task with an expert kernel")
    several = [t for t in args.tasks if catalogue[t].gemm_count > 1]
    if several:
        ap.error(f"--tasks {' '.join(several)}: tasks of several GEMMs are timed by `epiforge compare`, not here")
    shapes = {s.name: s for s in tasks.shape_sets()["paper"]}
    if set(args.scales) - set(shapes):
        ap.error(f"--scales: use some of {' '.join(shapes)}")
    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = ClockStateReport(environment=fingerprint(command_line("lab.bench.clock_state", argv)), reps=args.reps, rows=[])
    for tid in args.tasks:
        task = catalogue[tid]
        module = load_kernel_module(expert_kernel(task.name))
        for scale in args.scales:
            row = measure_row(task, module, shapes[scale], regimes, args.reps)
            report.rows.append(row)
            print(tid, scale, " ".join(f"{r.regime}={r.fused_over_gemm_only.median:.3f}" for r in row.regimes), flush=True)
            write_report(out, report)  # partial results survive a timeout
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
