"""Turn bench/h200.sh profile's Nsight Compute output into a result file: per run (task,
scale, what), the profiled kernel's metrics, and each run against the plain quack GEMM of
the same task at the same config (time, DRAM bytes, DRAM and SM throughput).

    python -m epiforge.bench.ncu_report ncu.txt --out bench/results/h200/ncu.json

ncu locks the clocks (to base, by default) while it profiles, so these times are not the
power-capped ones bench.run measures; they show what the kernel costs with the power cap
taken out.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

_HEADER = re.compile(r"^==> .*ncu-(k\d+)-([0-9]+B)-(\w+)\.csv <==$")
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed")


def parse(text: str) -> dict[tuple[str, str, str], dict]:
    """{(task, scale, what): {"kernel": name, metric: value}} from `tail -n +1 ncu-*.csv`
    output (a "==> file <==" line before each run's CSV rows)."""
    runs: dict[tuple[str, str, str], dict] = {}
    current = None
    for line in text.splitlines():
        m = _HEADER.match(line.strip())
        if m:
            current = runs.setdefault(m.groups(), {})
            continue
        if current is None or not line.startswith('"'):
            continue
        row = next(csv.reader(io.StringIO(line)))
        if len(row) < 15 or row[12] not in METRICS:
            continue
        current["kernel"] = row[4]
        current[row[12]] = float(row[14].replace(",", ""))
    if not runs:
        raise ValueError("no ncu runs in it (expected '==> .../ncu-<task>-<scale>-<what>.csv <==' headers)")
    missing = [" ".join(k) for k, v in runs.items() if any(m not in v for m in METRICS)]
    if missing:
        raise ValueError(f"no complete metrics for: {', '.join(missing)} (did ncu fail? see its output)")
    return runs


def compare(runs: dict) -> list[dict]:
    """Each run beside the plain GEMM of its task and scale."""
    rows = []
    for (task, scale, what), m in sorted(runs.items()):
        base = runs.get((task, scale, "gemm"))
        row = {"task": task, "scale": scale, "what": what, **m}
        if base:
            row["time_over_gemm"] = m["gpu__time_duration.sum"] / base["gpu__time_duration.sum"]
            row["dram_bytes_over_gemm"] = ((m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"])
                                           / (base["dram__bytes_read.sum"] + base["dram__bytes_write.sum"]))
        rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| task | scale | run | time / plain GEMM | DRAM read (MB) | DRAM write (MB) | DRAM % of peak | SM % of peak |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['scale']} | {r['what']} | {r.get('time_over_gemm', float('nan')):.3f} | "
                     f"{r['dram__bytes_read.sum'] / 1e6:.0f} | {r['dram__bytes_write.sum'] / 1e6:.0f} | "
                     f"{r['dram__throughput.avg.pct_of_peak_sustained_elapsed']:.1f} | "
                     f"{r['sm__throughput.avg.pct_of_peak_sustained_elapsed']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ncu_text", help="bench/h200.sh profile's ncu.txt")
    ap.add_argument("--environment", default=None,
                    help="a JSON file with the run's environment (bench.gpu_env.fingerprint), written beside ncu.txt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        rows = compare(parse(Path(args.ncu_text).read_text()))
        env = json.loads(Path(args.environment).read_text()) if args.environment else None
    except (OSError, ValueError) as e:
        ap.error(str(e))
    from epiforge.bench.gpu_env import report_json

    Path(args.out).write_text(report_json({"environment": env, "profiler": "Nsight Compute (ncu), clocks locked by ncu",
                                           "rows": rows}))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
