"""The best measured config of each expert kernel per GEMM shape, from bench/run.py result
files, as the TUNED table a kernel file carries (so a rerun does not retune: the kernel
picks its config itself with primitives.pick_config).

    python -m bench.tuning bench/results/h200/run-*.json bench/results/h200/tune*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def best_configs(files: list[str]) -> dict[str, dict[str, tuple[str, float]]]:
    """{task: {"MxNxK": (config key, fused / GEMM-only)}}, the lowest ratio over all files
    (each ratio measured within one run)."""
    best: dict[str, dict[str, tuple[str, float]]] = {}
    for f in files:
        for row in json.loads(Path(f).read_text())["rows"]:
            quack = [v["gemm_quack"]["median_us"] for v in row["configs"].values() if "gemm_quack" in v]
            if not quack:
                continue
            gemm_only = min(row["gemm_cublas"]["median_us"], *quack)
            shape = "x".join(str(x) for x in row["gemm_mnk"])
            for cfg, v in row["configs"].items():
                if "fused" in v:
                    ratio = v["fused"]["median_us"] / gemm_only
                    cur = best.setdefault(row["task"], {}).get(shape)
                    if cur is None or ratio < cur[1]:
                        best[row["task"]][shape] = (cfg, ratio)
    return best


def main(argv=None) -> int:
    files = sys.argv[1:] if argv is None else argv
    for task, shapes in sorted(best_configs(files).items()):
        print(f"# {task}")
        print("TUNED = {")
        for shape, (cfg, ratio) in sorted(shapes.items(), key=lambda kv: int(kv[0].split("x")[1])):
            print(f'    "{shape}": "{cfg}",  # {ratio:.3f} of GEMM-only')
        print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
