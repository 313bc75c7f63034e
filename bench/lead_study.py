"""Which GPU state should the judge time in? compare's runs of the same tasks under each
timed lead (eval/timing.py Lead: what the GPU does before each synchronized timed call) set
beside bench/run.py's back-to-back runs of them in the same GPU session, before and after.

    python -m epiforge.bench.lead_study --lead spin=S1.sqlite heat:3=S2.jsonl ... \
        --bench B1.json B2.json --commit HASH --command "..." --out lead-study.md

Per lead and row: compare's fused / GEMM-only over bench's (1.000: the two harnesses agree),
with each harness's SM clock; bench's second run over its first is the run-to-run noise the
agreement is held to. Writes Markdown (and prints each lead's largest disagreement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def _report(bench_path: Path):
    from epiforge.eval.bench_rows import BenchReport, load_report

    return load_report(bench_path, BenchReport)


def _rows(bench_path: Path) -> dict[tuple[str, str], float]:
    return {(r.task, r.shape): r.fused_over_gemm_only for r in _report(bench_path).rows if r.fused is not None}


def _results(path: Path, commit: str, command: str) -> list:
    """The Results of a compare store (.sqlite) or of a file that bench.compare_export wrote (.jsonl)."""
    from epiforge.bench.compare_export import load
    from epiforge.eval.result import Result

    if path.suffix == ".jsonl":
        return [Result.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]
    return load([path], [commit], command)


def study(leads: dict[str, Path], benches: list[Path], commit: str, command: str) -> tuple[list[str], dict]:
    """(Markdown lines, {lead: largest |compare / bench - 1|}), against the first bench file;
    with two bench files, "noise" is the largest |second / first - 1| over their rows."""
    from epiforge.bench.compare_export import agreement, agreement_table

    first = _report(benches[0])
    lines = [f"# The judge's timed lead against bench/, one GPU session (commit {commit})", "",
             f"Made by `{command}`. compare's fused / GEMM-only for the expert kernels under each lead "
             "(eval/timing.py `Lead`), over bench/run.py's for the same rows in the first bench run "
             f"({benches[0].name}).", ""]
    worst = {}
    if len(benches) > 1:
        a, b = _rows(benches[0]), _rows(benches[1])
        common = sorted(set(a) & set(b))
        worst["noise"] = max((abs(b[k] / a[k] - 1) for k in common), default=float("nan"))
        lines += ["## bench against itself (the run-to-run noise)", "",
                  "| task | shape | first | second | second / first |", "|---|---|---|---|---|"]
        lines += [f"| {t} | {s} | {a[(t, s)]:.3f} | {b[(t, s)]:.3f} | {b[(t, s)] / a[(t, s)]:.3f} |"
                  for t, s in common]
        lines.append("")
    for lead, store in leads.items():
        rows = agreement(_results(store, commit, command), first)
        worst[lead] = max((abs(r.compare / r.bench - 1) for r in rows), default=float("nan"))
        med = statistics.median(r.compare / r.bench for r in rows) if rows else float("nan")
        lines += [f"## lead {lead}: largest disagreement {worst[lead]:.1%}, median compare / bench {med:.3f}", ""]
        lines += agreement_table(rows, clocks=True)
        lines.append("")
    return lines, worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lead", nargs="+", required=True, help="LEAD=STORE, one per lead, in the order they ran (a compare store, or its compare_export .jsonl)")
    ap.add_argument("--bench", nargs="+", type=Path, required=True, help="bench/run.py files of the same session")
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
        leads[lead] = Path(store)
    try:
        lines, worst = study(leads, args.bench, args.commit, args.command)
    except ValueError as e:  # a bench file or a Results line that is not one
        print(f"lead_study: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    args.out.write_text("\n".join(lines) + "\n")
    for lead, w in worst.items():
        print(f"lead {lead}: largest |compare / bench - 1| {w:.1%}" if lead != "noise"
              else f"bench run-to-run: largest |second / first - 1| {w:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
