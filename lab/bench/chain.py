"""The backward chain of one layer boundary, where CODA's backward gains come from:

  fused:    k7 (down-proj dgrad + SwiGLU backward + ZdZ partials) -> row_sum
            -> k6 (gate/up dgrad + RMSNorm backward using ZdZ) -> col_sum
  unfused:  the same math in plain PyTorch, compiled with torch.compile (cuBLAS GEMMs +
            Inductor), computing the RMSNorm correction the usual way: a full pass over
            g = dz @ w_gu after the second GEMM
  GEMM-only: the two dgrad GEMMs alone, each the fastest of cuBLAS and quack's
            identity-epilogue GEMM at the sweep's fastest configs: the bound a perfect
            fusion reaches

    python -m lab.bench.chain --out lab/results/h200/chain.json
    python -m lab.bench.chain --scales 1B 7B --k7-configs 128x128_c1x2_pp_cs2_cl --out chain-cl.json

--k7-configs times more fused chains in the same run, k7 at other configs (a flag against
its twin: ChainRow.variants_over_fused).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lab.bench.run import N_INPUT_SETS, REPS


def make_chain_inputs(dims, seed, device="cuda"):
    """A consistent forward state and an incoming gradient for one MLP block."""
    from epiforge.tasks import common

    gen = torch.Generator(device=device).manual_seed(seed)
    M, d, F = dims["M"], dims["d"], dims["F"]
    x = common.normal((M, d), gen, device)
    nw = common.norm_weight(d, gen, device)
    rstd = common.rstd_of(x, 1e-6)
    w_gu = common.linear_weight(2 * F, d, gen, device)
    h = (x.float() * rstd[:, None] * nw.float()).bfloat16()
    return {
        "x": x, "norm_weight": nw, "rstd": rstd, "w_gu": w_gu, "z": h @ w_gu.T,
        "w_down": common.linear_weight(d, F, gen, device),
        "dout": common.normal((M, d), gen, device, std=1e-2),
        "dx_in": common.normal((M, d), gen, device, std=1e-2),
    }


def fused_chain(k7, k6, config7=None, config6=None):
    """None: each kernel picks its own tuned config."""
    def run(s):
        a = k7.run({"dout": s["dout"], "w_down": s["w_down"], "z": s["z"]}, {}, config=config7)
        b = k6.run({"dz": a["dz"], "w_gu": s["w_gu"], "x": s["x"], "rstd": s["rstd"], "norm_weight": s["norm_weight"],
                    "dx_in": s["dx_in"], "zdz": a["zdz"]}, {}, config=config6)
        return a["dz"], a["out"], b["dx"], b["h"], b["dw"]

    return run


def unfused_chain(s):
    g_out = s["dout"] @ s["w_down"]
    gate, up = s["z"][:, 0::2].float(), s["z"][:, 1::2].float()
    sg = torch.sigmoid(gate)
    d_gate = g_out * up * sg * (1 + gate * (1 - sg))
    d_up = g_out * gate * sg
    dz = torch.stack((d_gate, d_up), dim=-1).flatten(1).to(torch.bfloat16)
    out = (gate * sg * up).to(torch.bfloat16)
    g = (dz @ s["w_gu"]).float()
    rstd = s["rstd"][:, None]
    xhat = s["x"].float() * rstd
    wg = g * s["norm_weight"].float()
    c = (wg * xhat).mean(-1, keepdim=True)
    dx = (s["dx_in"].float() + rstd * (wg - xhat * c)).to(torch.bfloat16)
    h = (xhat * s["norm_weight"].float()).to(torch.bfloat16)
    return dz, out, dx, h, (g * xhat).sum(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scales", nargs="*", default=None)
    ap.add_argument("--reps", type=int, default=REPS, help="timed repetitions of each function")
    ap.add_argument("--configs-from", nargs="*", default=None,
                    help="sweeps' JSON (bench.run; later files override): k7 and k6 at their best configs, and "
                         "quack's identity-epilogue GEMMs at theirs as part of GEMM-only")
    ap.add_argument("--k7-configs", nargs="*", default=[], metavar="KEY",
                    help="also time the fused chain with k7 at each of these configs (k6 at its own), in the same "
                         "run: e.g. the C-load warp's twin of k7's pick (ChainRow.variants_over_fused)")
    ap.add_argument("--sol-from", nargs="*", default=None,
                    help="sweeps' JSON: k7 and k6 at their own tuned configs, quack's identity GEMMs at the swept best")
    args = ap.parse_args(argv)
    if args.reps < 5:
        ap.error("--reps must be at least 5 (medians and quartiles of fewer mean little)")
    from epiforge.primitives.config import GemmConfig

    try:
        k7_variants = [GemmConfig.parse(k) for k in args.k7_configs]
    except ValueError as e:
        ap.error(f"--k7-configs: {e}")
    from lab.bench.rows import BenchReport, ChainReport, ChainRow, load_report

    try:
        picked_from = [(load_report(f, BenchReport), bool(args.configs_from))
                       for f in (args.configs_from or []) + (args.sol_from or [])]
    except ValueError as e:
        ap.error(str(e))

    from epiforge import tasks
    from lab.bench.gpu_env import fingerprint, write_report
    from epiforge.eval.machine import command_line
    from epiforge.eval.precompiled import install_precompiled
    from epiforge.eval.kernel import HUMAN_DIR, load_kernel_module
    from epiforge.eval.timing import time_cuda_interleaved

    install_precompiled()
    k7 = load_kernel_module(HUMAN_DIR / "k7_gemm_partial_swiglu_bwd.py")
    k6 = load_kernel_module(HUMAN_DIR / "k6_gemm_residual_partial_rmsnorm_bwd.py")
    from epiforge import primitives as P
    from epiforge.eval.baselines import identity_gemm as gemm_only
    from lab.bench.run import fastest_gemms

    swept, sol = {}, {}
    for report_in, their_configs in picked_from:
        for r in report_in.rows:
            if r.best_config is not None:
                if their_configs:
                    swept[r.task[:2], r.shape] = GemmConfig.parse(r.best_config)
                sol[r.task[:2], r.shape] = [GemmConfig.parse(k) for k in fastest_gemms(r)]
    compiled = torch.compile(unfused_chain, dynamic=True)
    report = ChainReport(environment=fingerprint(command_line("lab.bench.chain", argv)), rows=[])
    for shape in tasks.shape_sets()["paper"]:
        if args.scales and shape.name not in args.scales:
            continue
        t0 = time.monotonic()
        fused = fused_chain(k7, k6, swept.get(("k7", shape.name)), swept.get(("k6", shape.name)))
        sets = [(make_chain_inputs(shape.dims(), 200 + i),) for i in range(N_INPUT_SETS)]
        ref, got = compiled(sets[0][0]), fused(sets[0][0])
        agree = {name: float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
                 for name, a, b in zip(("dz", "out", "dx", "h", "dw"), got, ref)}
        # each dgrad GEMM alone, cuBLAS and quack's identity epilogue at the sweep's fastest configs
        # (the same operand layouts as k7 and k6); GEMM-only sums the faster of each
        fns = {
            "fused": (fused, sets),
            "torch_compile": (compiled, sets),
            "k7_gemm@cublas": (lambda s: s["dout"] @ s["w_down"], sets),
            "k6_gemm@cublas": (lambda s: s["z"] @ s["w_gu"], sets),
        }
        for c in k7_variants:
            fns[f"fused@k7={c.key()}"] = (fused_chain(k7, k6, c, swept.get(("k6", shape.name))), sets)
        for c in sol.get(("k7", shape.name), []):
            fns[f"k7_gemm@{c.key()}"] = (lambda s, _c=c: gemm_only(s["dout"], s["w_down"].T, config=_c), sets)
        for c in sol.get(("k6", shape.name), []):
            fns[f"k6_gemm@{c.key()}"] = (lambda s, _c=c: gemm_only(s["z"], s["w_gu"].T, config=_c), sets)
        timed = time_cuda_interleaved(fns, reps=args.reps)
        s0 = sets[0][0]  # the configs the two kernels ran at: the sweep's, or their own picks
        own = {"k7": swept.get(("k7", shape.name)) or P.pick_config(k7.TUNED, s0["dout"], s0["w_down"].T),
               "k6": swept.get(("k6", shape.name)) or P.pick_config(k6.TUNED, s0["z"], s0["w_gu"].T)}
        row = ChainRow.measured(shape=shape.name, dims=shape.dims(), configs={k: c.key() for k, c in own.items()},
                                timings=timed, max_rel_diff_fused_vs_compiled=agree)
        report.rows.append(row)
        also = "".join(f"; {k} {v:.3f} of fused" for k, v in row.variants_over_fused.items())
        print(f"chain {shape.name}: {row.speedup_vs_compile:.2f}x vs torch.compile (bound {row.bound:.2f}x), "
              f"fused {row.fused_over_gemm_only:.3f} of GEMM-only{also}; max rel diff {max(agree.values()):.2e}; "
              f"{timed['fused'].clocks.line()} ({time.monotonic() - t0:.0f} s)", flush=True)
        write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
