"""What the compiler made of an expert kernel at a config, without a GPU: cross-compile each
`task:config` for sm_90a and count, in its SASS, the instructions, the TMA stores (one per
stored tensor per epilogue sub-tile), the HGMMAs, and the local-memory spills (STL/LDL); and
give each GEMM's shared-memory pipeline stages as quack sized them (A/B for the mainloop, D
and C for the epilogue; primitives/lowering.STAGES).

    python -m lab.bench.sass_stats k7:128x128_c1x2_pp_cs2 k7:128x128_c1x2_pp_cs2_en64 --json out.json

--json writes {"environment": versions, command, commit; "runs": {task:config: {"objects":
[counts of each object it compiled], "stages": {GEMM: {"ab", "d", "c"}}}}}.

Why a config is slow is often visible here: a wider epilogue sub-tile (epi_tile_n) that
spills registers, a mainloop left two A/B stages by the epilogue's C stages (epi_c_stages),
or a kernel that did not get the instruction it was meant to (a GPU result
file links to the counts that explain it). Each run compiles in this process into a fresh
quack cache; the objects a run adds are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

#: instruction name prefixes counted in every object
COUNTED = {"tma_stores": "UTMASTG", "tma_loads": "UTMALDG", "hgmma": "HGMMA", "spill_stores": "STL", "spill_loads": "LDL"}


def counts(obj: Path) -> dict:
    """The instruction counts of one compiled object."""
    from lab.bench.sass import instructions, sass_of

    ins = instructions(sass_of(obj))
    return {"instructions": len(ins), **{k: sum(i.startswith(p) for i in ins) for k, p in COUNTED.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="TASK:CONFIG", help="e.g. k0:128x128_c1x2_pp_en64")
    ap.add_argument("--json", type=Path, help="write the counts here too")
    args = ap.parse_args(argv)
    from lab.bench.precompile import _cross_compile_environment

    _cross_compile_environment()
    cache = Path(tempfile.mkdtemp(prefix="epiforge-sass-stats-"))
    os.environ["QUACK_CACHE_DIR"] = str(cache)  # before quack is imported: it reads it once

    from epiforge import tasks
    from epiforge.eval.kernel import expert_kernel, load_kernel_module
    from epiforge.primitives import lowering
    from epiforge.primitives.config import GemmConfig

    dims = tasks.shape_sets()["smoke"][0].dims()
    wanted = []
    for run in args.runs:  # every argument checked before anything compiles
        tid, _, key = run.partition(":")
        try:
            task, config = tasks.get_task(tid), GemmConfig.parse(key)
        except (KeyError, ValueError) as e:
            ap.error(f"{run}: {str(e).strip(chr(39))}")
        if expert_kernel(task.name) is None:
            ap.error(f"{run}: {tid} has no expert kernel")
        wanted.append((run, task, config))
    out = {}
    for run, task, config in wanted:
        before = set(cache.glob("*/*.o"))
        lowering.STAGES.clear()  # the GEMMs this run traces (none where an earlier run built the same kernel)
        module = load_kernel_module(expert_kernel(task.name))
        inputs = task.make_inputs(dims, seed=0)
        consts = {t.name: inputs[t.name] for t in task.inputs if t.constant}
        prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
        try:
            module.run(dict(inputs), prepared, config=config)
        except Exception as e:  # a config the epilogue cannot take: say so, go on
            out[run] = {"error": f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"}
            print(f"{run}: {out[run]['error']}", flush=True)
            continue
        made = sorted(set(cache.glob("*/*.o")) - before)
        out[run] = {"objects": [counts(o) for o in made],
                    "stages": {name: dict(zip(("ab", "d", "c"), st)) for name, st in lowering.STAGES.items()}}
        for c in out[run]["objects"]:
            print(f"{run}: " + ", ".join(f"{k} {v}" for k, v in c.items()), flush=True)
        for name, st in out[run]["stages"].items():
            print(f"{run}: {name.split()[0]} stages A/B {st['ab']}, D {st['d']}, C {st['c']}", flush=True)
        if not made:
            print(f"{run}: nothing new compiled (an earlier run built the same kernel)", flush=True)
    if args.json:
        from epiforge.eval.machine import command_line
        from epiforge.eval.machine import fingerprint

        report = {"environment": fingerprint(None, command_line("lab.bench.sass_stats", argv)), "runs": out}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
