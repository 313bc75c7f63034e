"""Run one expert kernel, one of its diagnostics, or the plain quack GEMM at its config, a
few times at a paper shape: the process Nsight Compute profiles (lab/bench/h200.sh profile).

    ncu -k regex:cutlass --launch-skip 2 --launch-count 1 --metrics ... \
        python -m lab.bench.profile_one k7 1B fused|gemm|<diagnostic name>

Every call launches exactly one CuTe-DSL kernel (the fused GEMM; finishers are Triton or
torch), so skipping the first two of three profiles the third, with warm caches. The
config is the kernel's own TUNED pick, for all three kinds: the numbers compare like with
like. --c-load-warp sets GemmConfig.c_load_warp on that pick (fused and diagnostics; the
plain GEMM refuses the flag and keeps its twin's config), for before / after profiles;
--config pins another config (a pick that already has the flag needs its twin named).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("task", help="task id, e.g. k7")
    ap.add_argument("scale", help="paper shape name: 1B, 7B or 70B")
    ap.add_argument("what", help="fused, gemm, or a diagnostic's name (eval/quack_library.py DIAGNOSTICS)")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--c-load-warp", action="store_true", help="the TUNED pick with c_load_warp set (its _cl twin)")
    ap.add_argument("--lineinfo", action="store_true",
                    help="load the objects built with line info (precompile --lineinfo), through a quack cache of their own")
    ap.add_argument("--config", help="this config key instead of the TUNED pick (e.g. 128x128_c1x2_pp_cs1, or its _cl twin)")
    args = ap.parse_args(argv)
    from epiforge.primitives.config import GemmConfig

    try:
        pinned = GemmConfig.parse(args.config) if args.config else None
    except ValueError as e:
        ap.error(f"--config: {e}")

    from epiforge import tasks
    from epiforge.eval.kernel import expert_kernel

    task = next((t for t in tasks.load_catalogue()[0] if t.id == args.task), None)
    if task is None:
        ap.error(f"no task {args.task}")
    if expert_kernel(task.name) is None:
        ap.error(f"{task.id} has no expert kernel to profile")
    if task.gemm_count > 1:
        ap.error(f"{task.id} runs {task.gemm_count} fused GEMMs: profile_one profiles a task of one")
    shape = next((s for s in tasks.shape_sets()["paper"] if s.name == args.scale), None)
    if shape is None:
        ap.error(f"no paper shape {args.scale}")
    from epiforge.eval.quack_library import DIAGNOSTICS

    diags = DIAGNOSTICS.get(task.name, {})
    if args.what not in ("fused", "gemm", *diags):
        ap.error(f"{args.what}: not fused, gemm or one of {task.id}'s diagnostics {sorted(diags)}")

    from lab.bench.configs import LINEINFO_CACHE_DIR

    if args.lineinfo:  # before quack is imported: it reads both once
        import tempfile

        # quack's cache key does not hold the line-info option: a folder of their own, so
        # that no object without it is loaded in their place (and one built here has it too)
        os.environ["QUACK_CACHE_DIR"] = tempfile.mkdtemp(prefix="epiforge-lineinfo-")
        os.environ["CUTE_DSL_LINEINFO"] = "1"
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU: it is the process Nsight Compute profiles")
    from epiforge import primitives as P
    from epiforge.eval.baselines import identity_gemm as gemm_only
    from epiforge.eval.precompiled import install_precompiled
    from epiforge.eval.kernel import load_kernel_module

    if args.lineinfo:
        if not install_precompiled(LINEINFO_CACHE_DIR):
            ap.error(f"--lineinfo: no objects in {LINEINFO_CACHE_DIR.name} (bench.precompile --lineinfo)")
    else:
        install_precompiled()
    module = load_kernel_module(expert_kernel(task.name))
    inputs = task.make_inputs(shape.dims(), seed=100, device="cuda")
    consts = {t.name: inputs[t.name] for t in task.inputs if t.constant}
    prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
    a, b = task.gemm_operands(inputs)
    config = pinned or P.pick_config(getattr(module, "TUNED", {}), a, b)
    if args.c_load_warp:
        try:
            config = type(config).model_validate({**config.model_dump(), "c_load_warp": True})
        except ValueError as e:  # e.g. a pick with early_c_loads, which excludes it
            ap.error(f"--c-load-warp: {config.key()} cannot take it: {str(e).splitlines()[-1]}")
    if args.what == "fused":
        def call():
            return module.run(inputs, prepared, config=config)
    elif args.what == "gemm":
        def call():
            return gemm_only(a, b, config=config.for_plain_gemm())
    else:
        def call():
            return diags[args.what][0](inputs, config)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print(f"{task.id} {shape.name} {args.what} at {config.key()}: {args.calls} calls", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
