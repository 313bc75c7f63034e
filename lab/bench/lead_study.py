"""Which GPU state should the judge time in, and does compare agree with lab/bench/ within the
run-to-run noise? compare's runs of the same tasks under each timed lead (eval/timing.py
Lead: what the GPU does before each synchronized timed call) set beside lab/bench/run.py's
back-to-back runs of them in the same GPU session, before and after.

    python -m lab.bench.lead_study --lead spin=S1.sqlite heat:3=S2.jsonl heat:3@90=S3.jsonl ... \
        --bench B1.json B2.json --commit HASH --command "..." --out lead-study.md

Per lead and row: compare's fused / GEMM-only over bench's (1.000: the two harnesses agree),
with each harness's SM clock; bench's second run over its first is bench's run-to-run
noise. A lead named twice or more is that many compare runs: the report then sets compare
against itself too, and holds the mean of its runs against the mean of bench's runs to the
larger of the two harnesses' run-to-run changes (the "within the noise" section). Writes
Markdown (and prints each lead's largest disagreement). A label LEAD@N names compare runs
timed with N repetitions per shape (`compare --reps N`), so the same lead at two repetition
counts reads as two sets of runs; each store is checked to hold what its label says.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path


def _report(bench_path: Path):
    from lab.bench.rows import BenchReport, load_report

    return load_report(bench_path, BenchReport)


def _rows(bench_path: Path) -> dict[tuple[str, str], float]:
    return {(r.task, r.shape): r.fused_over_gemm_only for r in _report(bench_path).rows if r.fused is not None}


def _results(path: Path, commit: str, command: str) -> list:
    """The Results of a compare store (.sqlite) or of a file that bench.compare_export wrote (.jsonl)."""
    from lab.bench.compare_export import load
    from epiforge.eval.result import Result

    if path.suffix == ".jsonl":
        return [Result.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    return load([path], [commit], command)


def _self_table(title: str, runs: list[dict], names: list[str]) -> list[str]:
    """Rows both (all) runs timed: each run's fused / GEMM-only and last / first."""
    common = sorted(set.intersection(*(set(r) for r in runs)))
    lines = [title, "", "| task | shape | " + " | ".join(names) + " | last / first |",
             "|---|---|" + "---|" * (len(names) + 1)]
    lines += [f"| {t} | {s} | " + " | ".join(f"{r[(t, s)]:.3f}" for r in runs)
              + f" | {runs[-1][(t, s)] / runs[0][(t, s)]:.3f} |" for t, s in common]
    return lines + [""]


def _largest_change(runs: list[dict]) -> float:
    """The largest |last / first - 1| over the rows all runs timed."""
    common = set.intersection(*(set(r) for r in runs))
    return max((abs(runs[-1][k] / runs[0][k] - 1) for k in common), default=float("nan"))


def _within_noise(lead: str, compare_runs: list[dict], bench_runs: list[dict]) -> tuple[list[str], float]:
    """The mean (geometric) of compare's runs over the mean of bench's, per row, held to the
    larger of the two harnesses' largest run-to-run changes."""
    common = sorted(set.intersection(*(set(r) for r in compare_runs + bench_runs)))
    noise = {"compare": _largest_change(compare_runs),
             "bench": _largest_change(bench_runs) if len(bench_runs) > 1 else float("nan")}
    bound = max((v for v in noise.values() if not math.isnan(v)), default=float("nan"))
    rows = [(t, s, statistics.geometric_mean([r[(t, s)] for r in compare_runs]),
             statistics.geometric_mean([r[(t, s)] for r in bench_runs])) for t, s in common]
    worst = max((abs(c / b - 1) for _, _, c, b in rows), default=float("nan"))
    outside = [(t, s) for t, s, c, b in rows if abs(c / b - 1) > bound]
    lines = [f"## lead {lead}: compare ({len(compare_runs)} runs) against bench ({len(bench_runs)} runs), "
             "within the noise?", "",
             f"- compare's largest run-to-run change: {noise['compare']:.1%}; bench's: {noise['bench']:.1%}; "
             f"the bound: {bound:.1%}.",
             f"- The largest |mean compare / mean bench - 1| over {len(rows)} rows: {worst:.1%}; "
             f"{len(outside)} row(s) beyond the bound"
             + (": " + ", ".join(f"{t} {s}" for t, s in outside) if outside else "") + ".",
             f"- The median mean compare / mean bench: "
             f"{statistics.median(c / b for _, _, c, b in rows) if rows else float('nan'):.3f}.", "",
             "| task | shape | compare (mean) | bench (mean) | compare / bench |", "|---|---|---|---|---|"]
    lines += [f"| {t} | {s} | {c:.3f} | {b:.3f} | {c / b:.3f} |" for t, s, c, b in rows]
    return lines + [""], worst - bound


def _parse_label(label: str) -> tuple[str, int | None]:
    """LEAD or LEAD@N -> (LEAD, N or None); ValueError for a bad N (the lead itself is
    checked by eval.timing.Lead.parse)."""
    lead, sep, reps = label.partition("@")
    if not sep:
        return lead, None
    if not reps.isdigit() or int(reps) < 1:
        raise ValueError(f"{label!r}: LEAD@N wants a whole number of repetitions N >= 1")
    return lead, int(reps)


def _check_lead(label: str, store: Path, results: list) -> None:
    """A store named for a lead (LEAD or LEAD@N) must have been timed under it, with N timed
    repetitions per shape where N is named (the judge records the lead it timed under in
    each Result's environment, and each Timing its n); otherwise ValueError naming both."""
    from epiforge.eval.timing import Lead

    lead, reps = _parse_label(label)
    want = Lead.parse(lead).describe()
    seen = {r.environment.get("timed_lead") for r in results if r.device == "cuda"} - {None}
    if seen - {want}:
        raise ValueError(f"{store.name} was timed under {', '.join(sorted(seen))}, not under {lead} ({want})")
    if reps is not None:
        counts = {s.timing.kernel.n for r in results if r.device == "cuda" for s in r.per_shape if s.timing}
        if counts - {reps}:
            raise ValueError(f"{store.name} was timed with {', '.join(map(str, sorted(counts)))} repetitions "
                             f"per shape, not {reps} ({label})")


def study(leads: dict[str, list[Path]], benches: list[Path], commit: str, command: str) -> tuple[list[str], dict]:
    """(Markdown lines, {lead: largest |compare / bench - 1|}), each run against the first
    bench file; with two bench files, "noise" is bench's largest |second / first - 1|; for a
    lead with several runs, "LEAD beyond the noise" is how far the largest disagreement of
    the means lies beyond the noise bound (<= 0: within it)."""
    from lab.bench.compare_export import agreement, agreement_table

    first = _report(benches[0])
    lines = [f"# The judge's timed lead against lab/bench/, one GPU session (commit {commit})", "",
             f"Made by `{command}`. compare's fused / GEMM-only for the expert kernels under each lead "
             "(eval/timing.py `Lead`), over lab/bench/run.py's for the same rows in the first bench run "
             f"({benches[0].name}).", ""]
    worst = {}
    bench_runs = [_rows(b) for b in benches]
    if len(benches) > 1:
        worst["noise"] = _largest_change(bench_runs[:2])
        lines += _self_table("## bench against itself (the run-to-run noise)", bench_runs[:2], ["first", "second"])
    for lead, stores in leads.items():
        runs = []
        for i, store in enumerate(stores):
            results = _results(store, commit, command)
            _check_lead(lead, store, results)
            rows = agreement(results, first)
            runs.append({(r.task, r.shape): r.compare for r in rows})
            run = f"lead {lead}" + (f", run {i + 1} of {len(stores)}" if len(stores) > 1 else "")
            worst[run] = max((abs(r.compare / r.bench - 1) for r in rows), default=float("nan"))
            med = statistics.median(r.compare / r.bench for r in rows) if rows else float("nan")
            lines += [f"## {run}: largest disagreement {worst[run]:.1%}, median compare / bench {med:.3f}", ""]
            lines += agreement_table(rows, clocks=True)
            lines.append("")
        if len(runs) > 1 and all(runs):
            lines += _self_table(f"## compare under lead {lead} against itself", runs,
                                 [f"run {i + 1}" for i in range(len(runs))])
            verdict, beyond = _within_noise(lead, runs, bench_runs)
            lines += verdict
            worst[f"{lead} beyond the noise"] = beyond
    return lines, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lead", nargs="+", required=True,
                    help="LEAD=STORE or LEAD@N=STORE (compare run with --reps N), in the order they ran (a "
                         "compare store, or its compare_export .jsonl); a label named again is another run of it")
    ap.add_argument("--bench", nargs="+", type=Path, required=True, help="lab/bench/run.py files of the same session")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    leads = {}
    for item in args.lead:
        lead, sep, store = item.partition("=")
        if not sep or not Path(store).is_file():
            print(f"lead_study: {item!r} is not LEAD=STORE with an existing store", file=sys.stderr)
            return 2
        leads.setdefault(lead, []).append(Path(store))
    try:
        for lead in leads:
            _parse_label(lead)
        lines, worst = study(leads, args.bench, args.commit, args.command)
    except ValueError as e:  # a bench file or a Results line that is not one
        print(f"lead_study: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    args.out.write_text("\n".join(lines) + "\n")
    for what, w in worst.items():
        if what == "noise":
            print(f"bench run-to-run: largest |second / first - 1| {w:.1%}")
        elif what.endswith("beyond the noise"):
            print(f"{what}: {w:+.1%} ({'within' if w <= 0 else 'outside'} the noise)")
        else:
            print(f"{what}: largest |compare / bench - 1| {w:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
