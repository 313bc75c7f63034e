"""Render lab/bench/run.py result files as one markdown table (lab/results/h200/README.md).

The table shows the ratios the files hold (lab.bench.rows: BenchRow, ChainRow). --rederive
first recomputes every bench.run row's ratios from the samples the file holds, with the code
bench.run computes them with (lab.bench.rows.BenchRow.rederived), and writes them back (the file records when and at which commit): for a
definition added after the run, e.g. a like-for-like library comparison.

    python -m lab.bench.report lab/results/h200/run-*.json --out lab/results/h200/README.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

FUSED_TARGET = 1.05  # fused <= 1.05 x GEMM-only
BOUND_TARGET = 0.9  # speedup vs torch.compile >= 0.9 x (torch.compile / GEMM-only)
#: "at least as fast as quack's library epilogue" within the run-to-run noise measured on the
#: H200 (a rerun moved fused / GEMM-only by up to 0.023 in the finals of commit 6a24172, 0.011
#: per repetition in those of 8d7d13a: final.json vs final-2.json)
LIBRARY_NOISE = 0.02
#: the expert kernels that wrap one of quack's library epilogues (human_kernels/)
LIBRARY_KERNELS = ("k0", "k3", "k4", "k7", "k8", "k9")


def _verdict(r, again=None) -> str:
    """Against the targets; with a rerun, each metric at the worse of the two runs."""
    runs = [r] + ([again] if again else [])

    def worst(key, pick):
        vals = [getattr(x, key, None) for x in runs if getattr(x, key, None) is not None]
        return pick(vals) if vals else None

    misses = []
    ratio = worst("fused_over_gemm_only", max)
    if ratio > FUSED_TARGET:
        misses.append(f"fused {ratio:.2f}x GEMM-only")
    frac = worst("fraction_of_bound", min)
    if frac is not None and frac < BOUND_TARGET:
        misses.append(f"{frac:.2f} of bound" if round(frac, 2) < BOUND_TARGET else f"{frac:.4f} of bound")
    lib = worst("speedup_vs_quack_library_like_for_like", min)  # where the library does less than the task
    lib = worst("speedup_vs_quack_library", min) if lib is None else lib
    if lib is not None and lib < 1.0 - LIBRARY_NOISE:
        misses.append(f"{lib:.2f}x of quack's library epilogue")
    return "met" if not misses else "MISSED: " + ", ".join(misses)


def _with_iqr(r) -> str:
    """fused / GEMM-only with the quartiles of its per-repetition ratios."""
    iqr = r.fused_over_gemm_only_iqr
    return f"{r.fused_over_gemm_only:.3f}" + (f" ({iqr[0]:.3f}-{iqr[1]:.3f})" if iqr else "")


def chain_markdown(report) -> str:
    lines = [
        "## The backward chain of one layer boundary",
        "",
        "k7 (down-proj dgrad + SwiGLU backward + ZdZ partials) -> row_sum -> k6 (gate/up dgrad + "
        "RMSNorm backward from ZdZ) -> col_sum, against torch.compile of the unfused backward (cuBLAS "
        "GEMMs + Inductor, RMSNorm correction computed the usual way after the second GEMM) and against "
        "the two dgrad GEMMs alone (each the fastest of cuBLAS and quack's identity-epilogue GEMM at the sweep's "
        "three fastest configs). `lab/bench/chain.py`.",
        "",
        "| scale | configs (k7, k6) | speedup vs torch.compile | bound (compile / GEMM-only) | fraction of bound | fused / GEMM-only (IQR) | targets |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        cfgs = ", ".join(r.configs.values())
        lines.append(f"| {r.shape} | {cfgs} | {r.speedup_vs_compile:.2f}x | {r.bound:.2f}x | {r.fraction_of_bound:.2f} | "
                     f"{_with_iqr(r)} | {_verdict(r)} |")
    e = report.environment
    lines += ["", f"- `{e['command']}` on {e['date']}, same environment as above."]
    return "\n".join(lines) + "\n"


def rederive(report) -> int:
    """Recompute every bench.run row's ratios from its samples (BenchRow.rederived); returns
    how many rows. Every timing of a row must hold its samples, else ValueError: ratios from
    medians and from samples are not mixed in one file."""
    from epiforge.eval.quack_library import LIKE_FOR_LIKE

    again = [r.rederived(LIKE_FOR_LIKE.get(r.task)) if r.fused is not None else r for r in report.rows]
    report.rows = again
    return sum(r.fused is not None for r in again)


def markdown(reports: list, rerun=None) -> str:
    """reports: BenchReports and ChainReports (lab.bench.rows); rerun: a second run of the same
    rows (bench.run again), shown beside the first."""
    from lab.bench.rows import ChainReport

    chains = [r for r in reports if isinstance(r, ChainReport)]
    reports = [r for r in reports if not isinstance(r, ChainReport)]
    again = {(r.task, r.shape): r for r in (rerun.rows if rerun else []) if r.fused is not None}
    envs = [r.environment for r in reports]
    env = envs[0]
    lines = [
        f"# Expert kernels on the {env['gpu']}",
        "",
        "bf16, M = 16384 tokens. Every number is a ratio measured in the same process and run (CUDA events, "
        "L2 flushed before each repetition, rotating inputs; the fused kernel and its baselines interleaved "
        "repetition by repetition in a fresh random order each time, a short GPU spin before each so that host "
        "launch overhead stays outside the timed region), taken repetition by repetition: the median over "
        "repetitions of (kernel's time / baseline's time in the same repetition), so that the clock's drift at "
        "the power cap cancels; fused / GEMM-only shows the interquartile range of those ratios too. "
        "GEMM-only (the speed of light) = the fastest of cuBLAS and quack's identity-epilogue GEMM, the latter at the fused kernel's config and at its own "
        "best config from the sweep (lab/results/h200/sweep*.json), for the same shape and operand layouts. "
        f"Targets: fused / GEMM-only <= {FUSED_TARGET}; speedup over cuBLAS + torch.compile >= "
        f"{BOUND_TARGET} x the bound (torch.compile / GEMM-only), i.e. fraction of bound >= {BOUND_TARGET}; "
        "at least as fast as quack's library epilogue (k0, k3, k4, k7, k8, k9 are library epilogues; k2, k5, "
        "k6 are ours, timed beside the closest library epilogue at its own best config; k1 has none), within "
        f"{LIBRARY_NOISE:.0%}, the run-to-run noise; where the library does less than the task (k6's does not "
        "store h), the kernel minus that work (a diagnostic, named in the cell) is what must be as fast.",
        "",
        "| task | scale | config | fused / GEMM-only (IQR) | rerun | quack GEMM at the fused config / cuBLAS | speedup vs torch.compile | bound | fraction of bound | speedup vs Liger | speedup vs quack library | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        for r in report.rows:
            if r.fused is None:
                lines.append(f"| {r.task} | {r.shape} | no config ran | | | | | | | | | |")
                continue
            q_over_c = r.quack_over_cublas or r.gemm_quack.median_us / r.gemm_cublas.median_us
            tc = f"{r.speedup_vs_compile:.2f}x" if r.speedup_vs_compile is not None else "not run"
            bound = f"{r.compile_over_gemm_only:.2f}x" if r.compile_over_gemm_only is not None else ""
            frac = f"{r.fraction_of_bound:.2f}" if r.fraction_of_bound is not None else ""
            liger = f"{r.speedup_vs_liger:.2f}x" if r.speedup_vs_liger is not None else ""
            lib = (f"{r.speedup_vs_quack_library:.2f}x ({r.quack_library_config})" if r.speedup_vs_quack_library is not None
                   else "is the library" if r.task[:2] in LIBRARY_KERNELS else "")
            if r.speedup_vs_quack_library_like_for_like is not None:
                lib += f"; {r.quack_library_like_for_like}: {r.speedup_vs_quack_library_like_for_like:.2f}x"
            a = again.get((r.task, r.shape))
            rerun_ratio = f"{a.fused_over_gemm_only:.3f}" if a else ""
            lines.append(f"| {r.task} | {r.shape} | {r.best_config} | {_with_iqr(r)} | {rerun_ratio} | "
                         f"{q_over_c:.3f} | {tc} | {bound} | {frac} | {liger} | {lib} | {_verdict(r, a)} |")
    rows = [r for rep in reports for r in rep.rows]
    spread = [t.iqr_us / t.median_us for r in rows for t in (r.fused, r.gemm_cublas) if t is not None]
    paired = [r.fused_over_gemm_only_iqr[1] - r.fused_over_gemm_only_iqr[0] for r in rows if r.fused_over_gemm_only_iqr]
    diffs = [abs(r.fused_over_gemm_only - again[r.task, r.shape].fused_over_gemm_only)
             for r in rows if (r.task, r.shape) in again and r.fused is not None]
    of_medians = [abs(r.fused_over_gemm_only_of_medians - again[r.task, r.shape].fused_over_gemm_only_of_medians)
                  for r in rows if r.fused_over_gemm_only_of_medians is not None and (r.task, r.shape) in again
                  and again[r.task, r.shape].fused_over_gemm_only_of_medians is not None]
    if diffs:
        lines += ["", f"Rerun: the same command again on the same machine right after (`{rerun.environment['command']}`); "
                  f"fused / GEMM-only moved by at most {max(diffs):.3f} (median {statistics.median(diffs):.3f}) "
                  "between the two runs" + (f" (taken as a ratio of medians instead: at most {max(of_medians):.3f}, median "
                                            f"{statistics.median(of_medians):.3f})" if of_medians else "")
                  + ". The targets column uses the worse of the two for every metric. "
                  "A ratio below 1.00 (fused faster than the plain GEMM) is measurement noise at the power "
                  "cap (see the implementation log), not a real speedup."]
    if spread:
        lines += ["", f"Spread: one function's own times (interquartile range / median over its repetitions) spread "
                  f"by up to {max(spread):.0%} (median {statistics.median(spread):.1%}) in this run"
                  + (f"; the per-repetition ratio fused / GEMM-only by up to {max(paired):.3f} (median "
                     f"{statistics.median(paired):.3f}) between its quartiles" if paired else "")
                  + ". Differences smaller than that are noise."]
    notes = {r.task: r.liger_note for r in rows if r.liger_note}
    errors = {r.task: r.errors["liger"] for r in rows if "liger" in r.errors}
    lines.append("")
    for task, note in sorted(notes.items()):
        lines.append(f"- Liger for {task}: {note}.")
    for task, err in sorted(errors.items()):
        lines.append(f"- Liger for {task} did not run: {err}")
    for r in rows:
        for name, d in r.diagnostics.items():
            lines.append(f"- Diagnostic, {r.task} {r.shape}: {name} ({d.note}) at {d.config}: "
                         f"{d.over_gemm_only:.3f} of GEMM-only, the kernel {r.fused_over_gemm_only:.3f}.")
    lib_notes = {r.task: r.quack_library_note for r in rows if r.quack_library_note}
    for task, note in sorted(lib_notes.items()):
        lines.append(f"- quack library for {task}: {note}.")
    lines.append("")
    if rerun:
        envs = envs + [rerun.environment]
    for e in envs:
        lines.append(f"- `{e['command']}` on {e['date']}: torch {e['torch']} (CUDA {e['cuda']}), "
                     f"nvidia-cutlass-dsl {e['nvidia-cutlass-dsl']}, quack-kernels {e['quack-kernels']}, "
                     f"triton {e['triton']}, driver {e['driver']}, Python {e['python']}.")
    text = "\n".join(lines) + "\n"
    for c in chains:
        text += "\n" + chain_markdown(c)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--rerun", default=None, help="a second run of the same bench.run command")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rederive", action="store_true",
                    help="recompute the bench.run rows' ratios from their samples and write them back first")
    args = ap.parse_args(argv)
    files = args.files + ([args.rerun] if args.rerun else [])
    loaded = {}
    from lab.bench.rows import BenchReport, load_report

    for f in files:
        try:
            loaded[f] = load_report(f)
        except ValueError as e:
            ap.error(str(e))
    if args.rederive:
        from lab.bench.gpu_env import source_commit, write_report

        for f, report in loaded.items():
            try:
                if isinstance(report, BenchReport) and rederive(report):
                    report.rederived = {"commit": source_commit(), "by": "python -m lab.bench.report --rederive"}
                    write_report(f, report)
            except ValueError as e:
                ap.error(f"{f}: {e}")
    text = markdown([loaded[f] for f in args.files], loaded[args.rerun] if args.rerun else None)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
