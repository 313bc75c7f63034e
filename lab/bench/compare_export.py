"""Results of `epiforge compare` runs on the H200 (their stores, one per GPU call) as one
committed file of Results, its Markdown tables, and its agreement with lab/bench/.

    python -m lab.bench.compare_export STORE [STORE ...] --commit HASH --command "..." \
        --jsonl eval/data/h200-compare.jsonl --markdown lab/results/h200/compare-paper.md \
        [--bench lab/results/h200/final.json]

A task and kernel compared again in a later store (given later) replaces the earlier Result.

Kernel paths become repo-relative (no machine path leaves the machine), and each Result's
environment gets the commit and command that made it (the judge records neither). With
--bench, each expert row's fused / GEMM-only is set beside the bench file's for the same
task and shape: two separate runs of the same kernel, each against its own speed of light,
so they agree only up to run-to-run drift (the file says how far apart they are). With
--same-session (the bench file made in the same GPU session) the table also shows the SM clock
and power-capped share each harness's timed phase saw (eval/clocks.py), where recorded.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NamedTuple

from epiforge.eval.clocks import ClockSummary
from epiforge.eval.machine import REPO


#: the judge's timed lead before eval/timing.py chose and recorded one (2026-12-03)
LEAD_UNRECORDED = "a ~2 ms GPU sleep (eval/timing.py Lead 'spin'; the run predates its record)"
#: what the header says where a run's fingerprint has no FlashInfer version (before eval/machine.py listed it)
FLASHINFER_UNRECORDED = "0.7.2.post1 (what ../shared/gpu/stage-flashinfer installs; the run's fingerprint did not record it)"


def load(stores: list[Path], commits: list[str], command: str) -> list:
    """The Results of the stores, kernel paths repo-relative; a task and kernel compared in
    a later store replaces the earlier Result (one Result per task, kernel file and precision).
    commits: one per store, or one for all."""
    from epiforge.eval.store import ResultStore

    if len(commits) not in (1, len(stores)):
        raise SystemExit("compare_export: give one --commit, or one per store")
    latest: dict[tuple[str, str, str], object] = {}
    for store, commit in zip(stores, commits * len(stores) if len(commits) == 1 else commits):
        for row in ResultStore(store, read_only=True).rows()[::-1]:  # rows() is newest first
            r = row.result
            kernel = Path(r.kernel)
            rel = next((str(kernel.relative_to(p)) for p in (REPO, *kernel.parents)
                        if kernel.is_relative_to(p) and (REPO / kernel.relative_to(p)).is_file()), kernel.name)
            latest.pop((r.task, rel, r.dtype), None)  # re-inserted: the order is the latest run's
            latest[(r.task, rel, r.dtype)] = r.model_copy(update={
                "kernel": rel, "environment": {**r.environment, "commit": commit, "command": command},
                "stderr_tail": scrub_paths(r.stderr_tail)})
    return list(latest.values())


def scrub_paths(text: str) -> str:
    """A GPU machine's install paths out of a stderr tail: every ".../site-packages" becomes
    "<site-packages>" (no machine path leaves the machine)."""
    return re.sub(r"(?:/[^\s/:'\"]+)+/site-packages", "<site-packages>", text)


def _repo_relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def comparisons(results: list) -> list:
    """One Comparison per task and precision, expert first, in the order the tasks were run."""
    from epiforge.eval.compare import Comparison

    by_task: dict[tuple[str, str], list] = {}
    for r in results:
        by_task.setdefault((r.task, r.dtype), []).append(r)
    cmps = []
    for (task, _), rs in by_task.items():
        rs = sorted(rs, key=lambda r: r.track != "expert")
        labels = ["expert" if r.track == "expert" else f"generated:{Path(r.kernel).stem}" if r.track == "generated"
                  else Path(r.kernel).stem for r in rs]
        cmps.append(Comparison(task=task, device=rs[0].device, shapes=rs[0].shapes, labels=labels, results=rs))
    return cmps


class Agreement(NamedTuple):
    """One expert row that compare and a bench file both timed."""

    task: str
    shape: str
    compare: float  # compare's fused / GEMM-only
    bench: float  # bench's
    cublas: float  # compare's cuBLAS time / bench's: how differently the machine ran in the two
    fused: float  # compare's fused time / bench's
    compare_clocks: ClockSummary | None  # the GPU's clocks in compare's timed phase (None: not recorded)
    bench_clocks: ClockSummary | None  # in bench's run


def agreement(results: list, bench) -> list[Agreement]:
    """An Agreement for each expert row of the Results that the bench file (an
    lab.bench.rows.BenchReport) has too: bf16 Results only, the precision lab/bench/run.py
    times (each task's first)."""
    theirs = {(row.task, row.shape): row for row in bench.rows if row.fused is not None}
    rows = []
    for r in results:
        if r.track != "expert" or r.dtype != "bfloat16":
            continue
        for s in r.per_shape:
            row = theirs.get((r.task, s.shape))
            if s.timing and row and "cublas" in s.timing.baselines:
                rows.append(Agreement(r.task, s.shape, s.timing.fused_over_gemm_only.median, row.fused_over_gemm_only,
                                      s.timing.baselines["cublas"].median_us / row.gemm_cublas.median_us,
                                      s.timing.kernel.median_us / row.fused.median_us,
                                      s.timing.kernel.clocks, row.fused.clocks))
    return rows


def _clock_cells(c: ClockSummary | None) -> tuple[str, str]:
    """(SM MHz median (min-max), power-capped share) of one harness's clocks, or why absent."""
    if c is None:
        return "not recorded", ""
    if c.absent:
        return f"absent: {c.absent}", ""
    cap = f"{c.power_capped_share:.0%}" if c.power_capped_share is not None else "not reported"
    return f"{c.sm_mhz_median:.0f} ({c.sm_mhz_min:.0f}-{c.sm_mhz_max:.0f})", cap


def agreement_table(rows: list[Agreement], clocks: bool) -> list[str]:
    """The agreement rows as Markdown; clocks: with each harness's SM clock and power-capped
    share (where either recorded them)."""
    head = ("| task | shape | compare | bench | compare / bench | cuBLAS time, compare / bench | "
            "fused time, compare / bench |")
    rule = "|---|---|---|---|---|---|---|"
    if clocks:
        head += " SM MHz, compare | SM MHz, bench | power-capped, compare | power-capped, bench |"
        rule += "---|---|---|---|"
    lines = [head, rule]
    for a in rows:
        line = (f"| {a.task} | {a.shape} | {a.compare:.3f} | {a.bench:.3f} | {a.compare / a.bench:.3f} | "
                f"{a.cublas:.3f} | {a.fused:.3f} |")
        if clocks:
            (c_mhz, c_cap), (b_mhz, b_cap) = _clock_cells(a.compare_clocks), _clock_cells(a.bench_clocks)
            line += f" {c_mhz} | {b_mhz} | {c_cap} | {b_cap} |"
        lines.append(line)
    return lines


def main(argv=None) -> int:
    from epiforge.cli import render_comparison

    ap = argparse.ArgumentParser()
    ap.add_argument("stores", nargs="+", type=Path)
    ap.add_argument("--commit", nargs="+", required=True,
                    help="the commit the GPU ran (EPIFORGE_COMMIT there): one, or one per store")
    ap.add_argument("--command", required=True, help="the command that made the stores")
    ap.add_argument("--jsonl", type=Path, required=True)
    ap.add_argument("--markdown", type=Path, required=True)
    ap.add_argument("--bench", type=Path, help="a bench result file (final.json) to check agreement with")
    ap.add_argument("--same-session", action="store_true",
                    help="the bench file was made in the same GPU session as the stores, minutes from them")
    ap.add_argument("--bench-when", default=None,
                    help="when and where the bench file was made, in words (e.g. on a second machine of the "
                         "same device session); shows the clock columns like --same-session")
    args = ap.parse_args(argv)
    results = load(args.stores, args.commit, args.command)
    commits = ", ".join(dict.fromkeys(args.commit))
    if not results:
        print("compare_export: the stores hold no Results", file=sys.stderr)
        return 1
    args.jsonl.write_text("".join(r.model_dump_json() + "\n" for r in results))
    env = results[0].environment
    fi_timed = any("flashinfer" in s.timing.speedup for r in results for s in r.per_shape if s.timing)
    fi = env.get("flashinfer-python") or (FLASHINFER_UNRECORDED if fi_timed else None)
    sets = " and ".join(dict.fromkeys(r.shapes for r in results))
    head = [f"# epiforge compare at the {sets} shapes on the {env.get('gpu')}", "",
            f"Made by `{args.command}` at commit {commits}, {env.get('date', '')[:10]}; driver "
            f"{env.get('driver')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, quack-kernels "
            f"{env.get('quack-kernels')}, nvidia-cutlass-dsl {env.get('nvidia-cutlass-dsl')}, liger-kernel "
            f"{env.get('liger-kernel')}, " + (f"flashinfer-python {fi}; " if fi else "FlashInfer not timed; ") +
            f"before each timed call the GPU ran {env.get('timed_lead', LEAD_UNRECORDED)}. "
            f"Tables by `python -m lab.bench.compare_export` from {_repo_relative(args.jsonl)}. Each task's kernels and baselines "
            "were timed in one interleaved run per shape; every ratio is a median of per-repetition ratios "
            "with its 95% bootstrap interval.", ""]
    body = [render_comparison(c) for c in comparisons(results)]
    tail = []
    if args.bench:
        from lab.bench.rows import BenchReport, load_report

        try:
            bench = load_report(args.bench, BenchReport)
        except ValueError as e:
            ap.error(str(e))
        rows = agreement(results, bench)
        if rows:
            worst = max(abs(a.compare / a.bench - 1) for a in rows)
            drift = [a.cublas for a in rows]
            clocks = (args.same_session or args.bench_when is not None) and any(
                a.compare_clocks or a.bench_clocks for a in rows)
            when = (f"lab/bench/run.py, {args.bench_when}" if args.bench_when is not None else
                    "lab/bench/run.py in the same GPU session as the compare runs, minutes apart" if args.same_session
                    else "lab/bench/run.py, an earlier run")
            tail = ["## Agreement with lab/bench/", "",
                    f"The expert kernels' fused / GEMM-only here and in {args.bench.name} ({when}): two runs, each "
                    f"against its own speed of light. Largest difference: {worst:.1%}. The same cuBLAS GEMM took "
                    f"{min(drift):.3f}-{max(drift):.3f} times its time in the bench run, so the two did not see the "
                    "same machine state (clocks, power)"
                    + (", although they ran minutes apart on one machine: the harnesses themselves differ in how "
                       "they load the GPU between repetitions." if args.same_session and args.bench_when is None
                       else "." if args.bench_when is not None
                       else "; a like-for-like check runs both in one GPU session.")
                    + (" The clock columns: the SM clock each harness's timed phase ran at (median, min-max "
                       "of NVML readings every 10 ms) and the share of readings throttled by the power cap."
                       if clocks else ""), "",
                    *agreement_table(rows, clocks), ""]
    args.markdown.write_text("\n".join(head) + "\n" + "\n".join(body) + "\n" + "\n".join(tail))
    print(f"{len(results)} Results -> {args.jsonl}, tables -> {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
