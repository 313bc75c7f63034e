"""Time every expert kernel beside its baselines, in one process and one run.

For each task and paper scale (d = 2048/4096/8192, M = 16384, bf16):
  fused           the expert kernel's run(): the fused GEMM plus its finishing steps, at
                  every candidate tile config (lab/bench/configs.py), or with --tuned at the
                  config the kernel picks itself from its TUNED table
  gemm_quack      quack's mainloop with an identity epilogue, at each of those configs
  gemm_quack_best the same at its own best config from a sweep (--sol-from / --configs-from)
  gemm_cublas     torch.matmul of the same GEMM shape and operand layouts (cuBLAS)
  torch_compile   cuBLAS + torch.compile (Inductor) of the task's unfused torch reference
                  (--compile; compiling costs ~20-60 s per task on the GPU machine)
  liger           cuBLAS + Liger-Kernel's Triton kernels (--liger, eval/liger.py)
  quack_library   quack's own library epilogue where the expert kernel is ours (--library,
                  eval/quack_library.py)
GEMM-only, the speed of light, is the fastest of gemm_cublas, gemm_quack and gemm_quack_best.
Timing: eval/timing.py (CUDA events on the current stream, L2 flushed, a GPU spin so host
overhead stays out, warm-up, rotating inputs, median of many); everything of one row, every
config included, in ONE interleaved run, so that clock, temperature or power-cap drift cannot
bias the ratios or the choice of config. Every ratio, and every ranking of configs (speed:
against the row's cuBLAS GEMM), is taken repetition by repetition (eval.timing.paired_ratio).
Every row is an lab.bench.rows.BenchRow (its one factory, BenchRow.measured, takes the
ratios), with the GPU's clocks over its run (eval/clocks.py) on every timing. Writes JSON
(with the environment); lab/bench/report.py renders the tables, lab/bench/tuning.py turns a sweep into
TUNED tables.

    python -m lab.bench.run --library --out sweep.json                       # sweep every config
    python -m lab.bench.run --configs-from sweep.json --top 3 --compile --liger --out confirm.json  # re-rank
    python -m lab.bench.run --tuned --sol-from sweep.json --compile --liger --library --out final.json
    python -m lab.bench.run --tasks k0 --shape-set llama3 --gemm-k F --configs 6 8 20 24 --out down.json

--gemm-k EXPR times a task whose GEMM's K is the same dimension as its N (k0) at another
K, EXPR evaluated on each shape's dimensions: k0's epilogue after the down projection (K = F)
instead of the out-projection (K = d), the GEMM the fused model runs it on
(training/model_ops.py). Only the GEMM's two operands are made K wide; every other input is
the task's at the shape's d (= N). Its rows are named SHAPE-K<k>, and lab/bench/tuning.py keys
them by their m x n x k like any other.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPS = 30
N_INPUT_SETS = 2


def _runs(name, fn, arg_sets, errors: dict[str, str]) -> bool:
    """Call fn once; a function that fails is recorded in errors and left out."""
    try:
        fn(*arg_sets[0])
        torch.cuda.synchronize()
        return True
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        return False


def gemm_k_refusal(task) -> str | None:
    """Why --gemm-k cannot re-widen this task's GEMM (None: it can). It needs one GEMM whose A
    (m, k) and B (n, k) are inputs, and whose k is the same dimension as its n, so that every
    other input's use of that dimension is N-sized and stays as the task makes it."""
    g = task.gemm
    names = {t.name for t in task.inputs}
    if g is None:
        return "it has several fused GEMMs"
    if g.a not in names or g.b not in names or (g.a_layout, g.b_layout) != ("mk", "nk"):
        return "its GEMM's operands are not inputs as A (m, k) and B (n, k)"
    if g.k != g.n:
        return f"its GEMM's k ({g.k}) is not its n ({g.n}), so other inputs may be K-sized"
    return None


def gemm_k_sizes(expr: str, shapes) -> dict[str, int]:
    """--gemm-k's K at each shape of the set, or ValueError (one line) where expr is no
    dimension expression or is not a positive multiple of 8 at every shape (a row of 16-bit
    values must be 16-byte aligned for TMA)."""
    from epiforge.tasks import dims as dimexpr
    from epiforge.tasks.spec import DIMENSIONS

    try:
        unknown = dimexpr.symbols(expr) - set(DIMENSIONS)
        if unknown:
            raise ValueError(f"unknown dimension(s) {' '.join(sorted(unknown))} (known: {' '.join(DIMENSIONS)})")
        sizes = {x.name: dimexpr.evaluate(expr, x.dims()) for x in shapes}
    except (ValueError, SyntaxError, ZeroDivisionError) as e:
        raise ValueError(f"--gemm-k {expr!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 or k % 8 for k in sizes.values()):
        raise ValueError(f"--gemm-k {expr!r} is not a positive multiple of 8 at every shape (the GEMM's rows of "
                         f"16-bit values must be 16-byte aligned): {sizes}")
    return sizes


def inputs_at_gemm_k(task, dims: dict[str, int], k: int, seed: int, device) -> dict:
    """The task's inputs at dims, but with its GEMM's K = k: A (m, k) N(0, 1) and B (n, k) with
    nn.Linear's scale, in the operands' own dtypes; every other input unchanged (the caller
    checked gemm_k_refusal)."""
    from epiforge.tasks import common

    inputs = task.make_inputs(dims, seed=seed, device=device)
    g = task.gemm
    a, b = inputs[g.a], inputs[g.b]
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    inputs[g.a] = common.normal((a.shape[0], k), gen, a.device, dtype=a.dtype)
    inputs[g.b] = common.linear_weight(b.shape[0], k, gen, b.device, dtype=b.dtype)
    return inputs


def bench_task(task, module, shape, configs, with_compile, compiled_ref, liger=None, library=None, library_config=None,
               sol_configs=(), diagnostics=None, reps=REPS, gemm_k=None):
    """Every config of the fused kernel, the identity-epilogue quack GEMM at each config,
    and every baseline, timed in ONE interleaved run (eval.timing), so that the configs are
    compared with each other as fairly as with the baselines; the row is made by
    lab.bench.rows.BenchRow.measured.

    library: quack's own library epilogue for a task whose expert kernel is ours
    ((fn(inputs, config), note, tuned table)), timed at every swept config too, or at
    library_config, or (--tuned) at its own tuned config. sol_configs: the configs where the
    identity-epilogue GEMM ran fastest in a sweep; they are timed too, as part of GEMM-only
    (several: the sweep's own ranking of close configs is noisy). diagnostics: {name: (fn,
    note)}, the kernel minus one piece of its work (eval/quack_library.py DIAGNOSTICS),
    timed at every config the fused kernel runs at. gemm_k: the GEMM's K where it is not the
    task's own (inputs_at_gemm_k; main's --gemm-k)."""
    from epiforge import primitives as P
    from epiforge.eval.quack_library import LIKE_FOR_LIKE
    from epiforge.eval.baselines import identity_gemm as gemm_only
    from lab.bench.rows import BenchRow, ConfigTimings
    from epiforge.eval.timing import time_cuda_interleaved

    dims = shape.dims()
    mnk, flops, min_bytes = task.gemm_shape(dims), task.flops(dims), task.min_bytes(dims)
    if gemm_k is None:
        sets = [task.make_inputs(dims, seed=100 + i, device="cuda") for i in range(N_INPUT_SETS)]
    else:
        sets = [inputs_at_gemm_k(task, dims, gemm_k, 100 + i, "cuda") for i in range(N_INPUT_SETS)]
        operand_bytes = sets[0][task.gemm.a].element_size()
        min_bytes += (gemm_k - mnk[2]) * (mnk[0] + mnk[1]) * operand_bytes
        mnk = (mnk[0], mnk[1], gemm_k)
        flops = 2 * mnk[0] * mnk[1] * gemm_k
    consts = {t.name: sets[0][t.name] for t in task.inputs if t.constant}
    prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
    operands = [task.gemm_operands(s) for s in sets]
    whole = [(s,) for s in sets]
    errors: dict[str, str] = {}
    fns = {"gemm_cublas": (lambda a, b: torch.matmul(a, b.T), operands)}
    liger_fn = liger and (lambda s, _f=liger[0]: _f(s, dims))  # noqa: E731
    if liger is not None and _runs("liger", liger_fn, whole, errors):
        fns["liger"] = (liger_fn, whole)
    if with_compile and compiled_ref is not None:
        fn = lambda s: compiled_ref(s, dims)  # noqa: E731
        if _runs("torch_compile", fn, whole, errors):
            fns["torch_compile"] = (fn, whole)
    for sol in sol_configs:
        fns[f"gemm_quack_best@{sol.key()}"] = (lambda a, b, _c=sol: gemm_only(a, b, config=_c), operands)
    at_config: dict[str, dict] = {}  # config key -> ConfigTimings' fields
    sweep = {}  # timed name -> (config key, what)
    library_timed = set()
    for cfg in configs:
        own = cfg is None  # the kernel's own choice (its TUNED table): no sweep
        if own:
            cfg = P.pick_config(getattr(module, "TUNED", {}), *operands[0])
        key = cfg.key()
        entry = at_config.setdefault(key, {"errors": {}, "diagnostics": {}})
        candidates = {
            "fused": (lambda s, _c=None if own else cfg: module.run(s, prepared, config=_c), whole),
            "gemm_quack": (lambda a, b, _c=cfg.for_plain_gemm(): gemm_only(a, b, config=_c), operands),
        }
        if library is not None:
            lib_cfg = library_config or (P.pick_config(library[2], *operands[0]) if own else cfg)
            if lib_cfg.key() not in library_timed:  # one fixed library config is timed once, not per fused config
                library_timed.add(lib_cfg.key())
                candidates["quack_library"] = (lambda s, _c=lib_cfg: library[0](s, _c), whole)
                entry["quack_library_config"] = lib_cfg.key()
        for dname, (dfn, _) in (diagnostics or {}).items():
            candidates[f"diag_{dname}"] = (lambda s, _f=dfn, _c=cfg: _f(s, _c), whole)
        for what, (fn, args) in candidates.items():
            if _runs(what, fn, args, entry["errors"]):
                fns[f"{what}@{key}"] = (fn, args)
                sweep[f"{what}@{key}"] = (key, what)
    timed = time_cuda_interleaved(fns, reps=reps)
    candidates_timed = {}
    for name, t in timed.items():
        if name in sweep:
            key, what = sweep[name]
            if what.startswith("diag_"):
                at_config[key]["diagnostics"][what[len("diag_"):]] = t
            else:
                at_config[key][what] = t
        elif name.startswith("gemm_quack_best@"):
            candidates_timed[name.split("@", 1)[1]] = t
    torch.cuda.empty_cache()
    return BenchRow.measured(
        task=task.name, shape=row_shape_name(shape.name, gemm_k), dims=dims, gemm_mnk=mnk, flops=flops,
        min_bytes=min_bytes, configs={k: ConfigTimings(**v) for k, v in at_config.items()},
        gemm_cublas=timed["gemm_cublas"], liger=timed.get("liger"), liger_note=liger[1] if "liger" in timed else None,
        torch_compile=timed.get("torch_compile"), gemm_quack_candidates=candidates_timed,
        quack_library_note=library[1] if library is not None else None, errors=errors,
        diagnostic_notes={name: note for name, (_, note) in (diagnostics or {}).items()},
        like_for_like=LIKE_FOR_LIKE.get(task.name))


def row_shape_name(shape: str, gemm_k: int | None) -> str:
    """A row's shape name: the set's, with -K<k> where --gemm-k set the GEMM's K."""
    return shape if gemm_k is None else f"{shape}-K{gemm_k}"


def fastest_gemms(row, n: int = 3) -> list[str]:
    """The sweep row's (lab.bench.rows.BenchRow) n fastest configs of the identity-epilogue
    GEMM (distinct kernels: epi_c_stages does not change a GEMM that loads no C), as that GEMM
    runs them (without early_c_loads, which it refuses)."""
    from epiforge.primitives.config import GemmConfig

    distinct = {}
    for k in row.fastest_configs("gemm_quack", len(row.configs)):
        plain = GemmConfig.parse(k).for_plain_gemm().key()
        distinct.setdefault(plain.split("_cs")[0], plain)  # _cs<S> and the C flags: one kernel
    return list(distinct.values())[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*", default=None)
    ap.add_argument("--shape-set", default="paper",
                    help="the tasks/shapes.toml set to run (default paper; e.g. llama1b, LLaMA-3.2-1B's GEMMs as "
                         "lab/bench/training.py runs them)")
    ap.add_argument("--scales", nargs="*", default=None, help="shape names within the set (paper: 1B 7B 70B)")
    ap.add_argument("--configs", nargs="*", default=None,
                    help="indexes into bench.configs.CANDIDATES, config keys, or a bench.configs.CONFIG_SETS name")
    ap.add_argument("--tuned", action="store_true", help="time each kernel at its own tuned config only (no sweep)")
    ap.add_argument("--compile", action="store_true", help="also time cuBLAS + torch.compile of the unfused code")
    ap.add_argument("--liger", action="store_true", help="also time Liger-Kernel composites where Liger has the op")
    ap.add_argument("--library", action="store_true", help="also time quack's library epilogue where the expert kernel is ours")
    ap.add_argument("--diagnostics", action="store_true",
                    help="also time the kernel minus one piece of its work where eval/quack_library.py has one")
    ap.add_argument("--configs-from", nargs="*", default=None,
                    help="sweeps' JSON (a later file's row overrides an earlier one's): time each row at the best "
                         "configs it found, and the identity-epilogue GEMM at its own best config")
    ap.add_argument("--top", type=int, default=1,
                    help="with --configs-from: time each row at its sweep's N fastest configs (a confirmation run "
                         "for bench.tuning, in the company of the final's baselines)")
    ap.add_argument("--sol-from", nargs="*", default=None,
                    help="sweeps' JSON: with --tuned, time the identity-epilogue GEMM at its best swept config too")
    ap.add_argument("--gemm-k", metavar="EXPR", default=None,
                    help="time the GEMM at this K instead of the task's own, a dimension expression evaluated on "
                         "each shape (e.g. F: k0 as the down projection); tasks whose K is their N only, "
                         "without --compile and --liger")
    ap.add_argument("--reps", type=int, default=REPS, help="timed repetitions of each function")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.top < 1 or (args.top > 1 and not args.configs_from):
        ap.error("--top N (N >= 1) applies to --configs-from")
    if args.reps < 5:
        ap.error("--reps must be at least 5 (medians and quartiles of fewer mean little)")
    if args.configs_from and args.sol_from:
        ap.error("--configs-from already gives the speed-of-light configs; pass one of the two")
    from lab.bench.rows import BenchReport, load_report

    try:  # before any GPU work: a bad file is one line, not a traceback minutes in
        picked_from = [load_report(f, BenchReport) for f in (args.configs_from or args.sol_from or [])]
    except ValueError as e:
        ap.error(str(e))

    from epiforge import tasks

    try:
        sets = tasks.shape_sets()
    except tasks.TaskError as e:  # a bad tasks/shapes.toml: its one line
        ap.error(str(e))
    shape_rows = sets.get(args.shape_set)
    if shape_rows is None:
        ap.error(f"--shape-set {args.shape_set!r}: not in tasks/shapes.toml ({', '.join(sets)})")
    if args.gemm_k is not None:
        if args.compile or args.liger:
            ap.error("--gemm-k times the kernel and the plain GEMMs: --compile and --liger make their own inputs "
                     "at the set's dimensions")
        try:
            gemm_ks = gemm_k_sizes(args.gemm_k, shape_rows)
        except ValueError as e:
            ap.error(str(e))
        from epiforge.eval.kernel import expert_kernel

        refused = {t.id: why for t in tasks.load_catalogue()[0] if (not args.tasks or t.id in args.tasks)
                   and expert_kernel(t.name) is not None and (why := gemm_k_refusal(t))}
        if refused:
            ap.error("--gemm-k: " + "; ".join(f"{tid}: {why}" for tid, why in refused.items()))
    unknown = set(args.scales or ()) - {x.name for x in shape_rows}
    if unknown:
        ap.error(f"--scales {' '.join(sorted(unknown))}: not in the {args.shape_set} set "
                 f"({' '.join(x.name for x in shape_rows)})")
    from lab.bench.configs import CANDIDATES, config_args
    from lab.bench.gpu_env import fingerprint, write_report
    from epiforge.eval.machine import command_line
    from epiforge.eval.precompiled import install_precompiled
    from epiforge.eval.baselines import unfused_fn
    from epiforge.eval.kernel import expert_kernel, load_kernel_module

    try:
        configs = [None] if args.tuned else config_args(args.configs) if args.configs is not None else CANDIDATES
    except (ValueError, IndexError) as e:
        ap.error(f"--configs: {e}")
    print(f"installed {install_precompiled()} precompiled objects", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = BenchReport(environment=fingerprint(command_line("lab.bench.run", argv)), reps=args.reps, rows=[])
    from epiforge.eval.liger import composites
    from epiforge.eval.quack_library import DIAGNOSTICS, alternatives

    liger = composites() if args.liger else {}
    library = alternatives() if args.library else {}
    swept = {}
    if picked_from:
        from epiforge.primitives.config import GemmConfig

        for report_in in picked_from:
            for r in report_in.rows:
                if r.best_config is None:  # no config of this row ran in that sweep
                    continue
                lib = r.quack_library_config
                swept[r.task, r.shape] = ([GemmConfig.parse(k) for k in r.fastest_configs("fused", args.top)],
                                          lib and GemmConfig.parse(lib),
                                          [GemmConfig.parse(k) for k in fastest_gemms(r)])
    for task in tasks.load_catalogue()[0]:
        if args.tasks and task.id not in args.tasks:
            continue
        if expert_kernel(task.name) is None:
            print(f"{task.id}: no expert kernel, skipped", flush=True)
            continue
        if task.gemm_count > 1:
            print(f"{task.id}: {task.gemm_count} fused GEMMs: lab/bench/run.py sweeps tasks of one GEMM; "
                  f"`epiforge compare --task {task.id} --device gpu` times this one, skipped", flush=True)
            continue
        module = load_kernel_module(expert_kernel(task.name))
        compiled_ref = None
        if args.compile:
            compiled_ref = torch.compile(unfused_fn(task), dynamic=True)
        for shape in shape_rows:
            if args.scales and shape.name not in args.scales:
                continue
            t0 = time.monotonic()
            gemm_k = gemm_ks[shape.name] if args.gemm_k is not None else None
            cfgs, lib_cfg, sol_cfgs = swept.get((task.name, row_shape_name(shape.name, gemm_k)), (configs, None, ()))
            if args.sol_from:  # only the speed-of-light config from the sweeps
                cfgs, lib_cfg = configs, None
            row = bench_task(task, module, shape, cfgs, args.compile, compiled_ref, liger.get(task.name),
                             library.get(task.name), lib_cfg, sol_cfgs,
                             DIAGNOSTICS.get(task.name) if args.diagnostics else None, args.reps, gemm_k)
            report.rows.append(row)
            msg = f"{row.fused_over_gemm_only or float('nan'):.3f} of GEMM-only"
            if row.speedup_vs_compile is not None:
                msg += f", {row.speedup_vs_compile:.2f}x vs torch.compile (bound {row.compile_over_gemm_only:.2f}x)"
            print(f"{task.id} {row.shape}: best {row.best_config} {msg}; {row.gemm_cublas.clocks.line()} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            write_report(out, report)  # partial results survive a timeout
    write_report(out, report)
    from lab.bench.report import markdown

    print(markdown([report]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
