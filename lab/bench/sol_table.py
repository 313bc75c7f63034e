"""The speed-of-light configs the evaluator times quack's identity-epilogue GEMM at, per
GEMM shape and B layout: each sweep row's fastest distinct configs (bench.run.fastest_gemms),
written to eval/data/sol-configs.json with where they came from.

    python -m lab.bench.sol_table lab/results/h200/sweep.json lab/results/h200/sweep-cs.json \
        lab/results/h200/sweep-c8.json --out eval/data/sol-configs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def table(reports: list, top: int = 3) -> dict[str, list[str]]:
    """reports: lab.bench.rows.BenchReports."""
    from epiforge import tasks
    from lab.bench.run import fastest_gemms

    out: dict[str, list[str]] = {}
    for report in reports:
        for row in report.rows:
            if not any(c.gemm_quack is not None for c in row.configs.values()):
                continue
            task = tasks.get_task(row.task)
            m, n, k = row.gemm_mnk
            key = f"{m}x{n}x{k}:{task.gemm.b_layout}"
            for cfg in fastest_gemms(row, top):
                base = cfg.split("_cs")[0]  # C stages change nothing in a GEMM that loads no C
                if base not in out.setdefault(key, []):
                    out[key].append(base)
    return {k: v[:top] for k, v in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from lab.bench.rows import BenchReport, load_report

    try:
        reports = [load_report(p, BenchReport) for p in args.sweeps]
    except ValueError as e:
        ap.error(str(e))
    doc = {"from": [str(p) for p in args.sweeps], "environment": reports[0].environment,
           "configs": table(reports, args.top)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(doc['configs'])} GEMM shapes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
