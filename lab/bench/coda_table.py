"""The coda baseline beside the experts, from `epiforge compare --json` files (lab/results/*/coda/):
per task and timed shape, the expert's median time, CODA's, and CODA's time / the expert's
(paired per repetition, with its 95 % interval), or why CODA was left out.

    python -m lab.bench.coda_table lab/results/h200/coda/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[str]:
    out = []
    for cmp in json.loads(path.read_text()):
        for label, r in zip(cmp["labels"], cmp["results"]):
            for s in r["per_shape"]:
                t = s.get("timing")
                if not t:
                    continue
                note = t["notes"].get("coda", "")
                ratio = t["speedup"].get("coda")
                if ratio is None:
                    why = note.removeprefix("left out: ")
                    out.append(f"| {cmp['task']} | {s['shape']} | {t['kernel']['median_us']:.1f} | - | - | left out: {why[:160]} |")
                    continue
                coda = t["baselines"]["coda"]["median_us"]
                held = "; ".join(p for p in note.split("; ")[1:] if p.startswith("not held"))
                out.append(f"| {cmp['task']} | {s['shape']} | {t['kernel']['median_us']:.1f} | {coda:.1f} | "
                           f"{ratio['median']:.3f} [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}] | {held[:160]} |")
    return out


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        print("usage: python -m lab.bench.coda_table FILE.json ...", file=sys.stderr)
        return 2
    env = json.loads(paths[0].read_text())[0]["results"][0]["environment"]
    print(f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, {env['date'][:10]}; expert kernels, bf16")
    print()
    print("| task | shape | expert (us) | coda (us) | coda / expert | note |")
    print("|---|---|---|---|---|---|")
    for p in paths:
        print("\n".join(rows(p)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
