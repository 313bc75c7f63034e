"""Turn lab/bench/h200.sh profile's Nsight Compute output into a result file: per run (task,
scale, what), the profiled kernel's metrics, and each run against the plain quack GEMM of
the same task at the same config (time, DRAM bytes, DRAM and SM throughput).

    python -m lab.bench.ncu_report ncu.txt --out lab/results/h200/ncu.json
    python -m lab.bench.ncu_report stalls.txt --stalls --out lab/results/h200/stalls/stalls.json

--stalls reads lab/bench/h200.sh profile-stalls' output instead: per run the warp-stall reasons
(smsp__average_warps_issue_stalled_<reason>_per_issue_active: warps stalled for that reason
per issued instruction, averaged over every warp of the kernel, producer and consumer alike)
and the time, each beside the plain GEMM's; a "<what>-cl" run (the C-load warp) also beside
its "<what>" twin.

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

_HEADER = re.compile(r"^==> .*ncu-(k\d+)-([0-9]+B)-([\w-]+)\.csv <==$")
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__throughput.avg.pct_of_peak_sustained_elapsed")


STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
TIME = "gpu__time_duration.sum"
WARPS_ACTIVE = "smsp__warps_active.avg.per_cycle_active"  # warps resident per scheduler per active cycle


def parse(text: str, wanted=lambda metric: metric in METRICS, required=METRICS) -> dict[tuple[str, str, str], dict]:
    """{(task, scale, what): {"kernel": name, metric: value}} from `tail -n +1 ncu-*.csv`
    output (a "==> file <==" line before each run's CSV rows): the metrics `wanted` keeps,
    each run with every `required` one."""
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
        if len(row) < 15 or not wanted(row[12]):
            continue
        current["kernel"] = row[4]
        current[row[12]] = float(row[14].replace(",", ""))
    if not runs:
        raise ValueError("no ncu runs in it (expected '==> .../ncu-<task>-<scale>-<what>.csv <==' headers)")
    missing = [" ".join(k) for k, v in runs.items() if any(m not in v for m in required)]
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


def parse_stalls(text: str) -> dict[tuple[str, str, str], dict]:
    """parse() of profile-stalls' output: {run: {"kernel", TIME, "stalls": {reason: value}}}."""
    runs = parse(text, lambda metric: metric in (TIME, WARPS_ACTIVE) or bool(STALL.match(metric)), (TIME,))
    return {run: {"kernel": m["kernel"], TIME: m[TIME], "warps_active_per_cycle": m.get(WARPS_ACTIVE),
                  "stalls": {STALL.match(k).group(1): v for k, v in m.items() if STALL.match(k)}}
            for run, m in runs.items()}


def stalls(runs: dict) -> list[dict]:
    """Per run of parse_stalls: time and each stall reason, beside the plain GEMM of its task
    and scale and, for a "-cl" run, beside its twin without the C-load warp."""
    rows = []
    for (task, scale, what), m in sorted(runs.items()):
        row = {"task": task, "scale": scale, "what": what, "kernel": m["kernel"], "time_ns": m[TIME],
               "warps_active_per_cycle": m["warps_active_per_cycle"], "stalls": m["stalls"]}
        for label, other in (("gemm", runs.get((task, scale, "gemm"))),
                             ("twin", runs.get((task, scale, what[:-3])) if what.endswith("-cl") else None)):
            if other:
                row[f"time_over_{label}"] = m[TIME] / other[TIME]
                row[f"stalls_minus_{label}"] = {r: v - other["stalls"].get(r, 0.0) for r, v in m["stalls"].items()}
        rows.append(row)
    if not any(r["stalls"] for r in rows):
        raise ValueError("no warp-stall metrics in it (expected smsp__average_warps_issue_stalled_*)")
    return rows


def stalls_markdown(rows: list[dict], top: int = 6) -> str:
    """The reasons that are largest anywhere, per run (warps stalled per issued instruction)."""
    worst = sorted({r for row in rows for r in row["stalls"]},
                   key=lambda r: -max(row["stalls"].get(r, 0.0) for row in rows))[:top]
    lines = ["| task | scale | run | time / plain GEMM | time / twin | warps active / cycle | " + " | ".join(worst) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(worst)]
    for row in rows:
        twin = f"{row['time_over_twin']:.3f}" if "time_over_twin" in row else ""
        active = row["warps_active_per_cycle"]
        lines.append(f"| {row['task']} | {row['scale']} | {row['what']} | {row.get('time_over_gemm', float('nan')):.3f} | "
                     f"{twin} | {'' if active is None else f'{active:.2f}'} | " + " | ".join(f"{row['stalls'].get(r, float('nan')):.2f}" for r in worst) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ncu_text", help="lab/bench/h200.sh profile's ncu.txt")
    ap.add_argument("--environment", default=None,
                    help="a JSON file with the run's environment (bench.gpu_env.fingerprint), written beside ncu.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stalls", action="store_true", help="lab/bench/h200.sh profile-stalls' output: warp-stall reasons")
    args = ap.parse_args(argv)
    try:
        text = Path(args.ncu_text).read_text()
        rows = stalls(parse_stalls(text)) if args.stalls else compare(parse(text))
        env = json.loads(Path(args.environment).read_text()) if args.environment else None
    except (OSError, ValueError) as e:
        ap.error(str(e))
    from lab.bench.gpu_env import report_json

    Path(args.out).write_text(report_json({"environment": env, "profiler": "Nsight Compute (ncu), clocks locked by ncu",
                                           "rows": rows}))
    print(stalls_markdown(rows) if args.stalls else markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
