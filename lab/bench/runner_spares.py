"""What the judge's spare runners save (eval/runner.py fork_spares): one CPU evaluation
through the CLI, as a user and the agent's ./check run it, with spares (the default) and
without (EPIFORGE_RUNNER_SPARES=0), in turns A B A B ..., whole processes timed from here.

    python -m lab.bench.runner_spares --runs 8 --out lab/results/cpu/runner-spares.json

Per run: the wall time, and the CPU time of the CLI and every process it waited for (the
judge, its runners; getrusage of the children). Reported: each mode's median and the
per-pair ratios (spares / new processes), median, min and max.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epiforge.eval.machine import REPO, source_commit


def one_run(args: list[str], spares: bool) -> dict:
    env = {**os.environ, "EPIFORGE_RUNNER_SPARES": "1" if spares else "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "epiforge", *args], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    outcome = json.loads(out.stdout)["outcome"] if out.stdout.strip().startswith("{") else f"exit {out.returncode}"
    return {"spares": spares, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "outcome": outcome}


def summary(runs: list[dict]) -> dict:
    pairs = list(zip(runs[0::2], runs[1::2]))
    out = {}
    for key in ("wall_s", "cpu_s"):
        ratios = [a[key] / b[key] for a, b in pairs]
        out[key] = {"spares_median": statistics.median(a[key] for a, _ in pairs),
                    "new_processes_median": statistics.median(b[key] for _, b in pairs),
                    "ratio_median": round(statistics.median(ratios), 3),
                    "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="pairs of runs (default 8), after one warm-up pair")
    ap.add_argument("--task", default="k1")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cli = ["eval", "--task", args.task, "--kernel", "human", "--device", "cpu", "--json", "--seed", "1"]
    for spares in (True, False):  # warm-up: the page cache, .pyc files
        one_run(cli, spares)
    runs = [one_run(cli, spares) for _ in range(args.runs) for spares in (True, False)]
    if any(r["outcome"] != "PASSED" for r in runs):
        print(f"not every run passed: {[r['outcome'] for r in runs]}", file=sys.stderr)
        return 1
    result = {"what": "one CPU evaluation through the CLI, with the judge's spare runners and without",
              "command": f"python -m epiforge {' '.join(cli)}", "commit": source_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                          "python": platform.python_version()},
              "summary": summary(runs), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    s = result["summary"]
    print(f"wall: spares {s['wall_s']['spares_median']:.2f} s, new processes {s['wall_s']['new_processes_median']:.2f} s "
          f"(ratio {s['wall_s']['ratio_median']}); CPU: {s['cpu_s']['spares_median']:.2f} s vs "
          f"{s['cpu_s']['new_processes_median']:.2f} s (ratio {s['cpu_s']['ratio_median']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
