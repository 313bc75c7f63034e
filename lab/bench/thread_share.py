"""Why conftest.py shares the cores out as CPU math threads among pytest's workers: as
many CLI evaluations as there are workers, started together, each with its processes at the
machine's core count of OpenMP/MKL threads (what every process took before) and at
cores // evaluations, in turns A B A B ...; the wall time until the last one ends.

    python -m lab.bench.thread_share --out lab/results/cpu/thread-share.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from epiforge.eval.machine import REPO, source_commit


def side_by_side(cli: list[str], n: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "epiforge", *cli], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env, cwd=REPO) for _ in range(n)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    wall = time.monotonic() - t0
    outcomes = [json.loads(o)["outcome"] if o.strip().startswith("{") else "no result" for o in outs]
    return {"threads": threads, "wall_s": round(wall, 2), "outcomes": outcomes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="layer")
    ap.add_argument("--shapes", default="heads")
    ap.add_argument("--evaluations", type=int, default=2, help="side by side (default 2: the suite's workers)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    shared = max(1, cores // args.evaluations)
    cli = ["eval", "--task", args.task, "--kernel", "human", "--device", "cpu", "--shapes", args.shapes, "--json",
           "--seed", "1"]
    runs = [side_by_side(cli, args.evaluations, t) for _ in range(args.rounds) for t in (cores, shared)]
    if any(o != "PASSED" for r in runs for o in r["outcomes"]):
        print(f"not every evaluation passed: {[r['outcomes'] for r in runs]}", file=sys.stderr)
        return 1
    median = {t: statistics.median(r["wall_s"] for r in runs if r["threads"] == t) for t in (cores, shared)}
    result = {"what": f"{args.evaluations} CPU evaluations started together, threads per process: the core count "
                      "and the cores shared out",
              "command": f"python -m epiforge {' '.join(cli)} (x{args.evaluations} side by side)",
              "commit": source_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"cpus": cores, "processor": platform.processor() or platform.machine(),
                          "python": platform.python_version()},
              "median_wall_s": {f"{t} threads": v for t, v in median.items()}, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.evaluations} evaluations side by side: {median[cores]:.1f} s at {cores} threads each, "
          f"{median[shared]:.1f} s at {shared}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
