"""k7: SwiGLU backward in the down projection's dgrad epilogue with quack's
dswiglu_dpreact_mod: C and D hold the 16-bit (gate, up) pairs packed, acc is one d_out per
pair; dsum collects per-tile sums of gate*d_gate + up*d_up (the ZdZ partials)."""

import primitives as P

TASK = "k7_gemm_partial_swiglu_bwd"
AUTHOR = "quack library (CODA's authors)"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",  # 1.264 of GEMM-only
    # with the C-load warp: 1.068 / 1.066 of GEMM-only in two runs, against 1.094 without it
    # (bench/results/h200/c-load-warp.json, c-load-warp-2.json)
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",  # 1.022 of GEMM-only
    # LLaMA-3.2-1B's shape (bench/run.py --shape-set llama1b, bench/results/h200/sweep-llama1b.json)
    "16384x8192x2048": "128x128_c1x2_pp",  # 1.234 of GEMM-only
    # LLaMA-3's 8B and 70B layers (bench/run.py --shape-set llama3): the H100's fastest
    # (bench/results/h100/sweep-llama3); on the H200 the fastest at 8B (1.072) and within
    # 1.6 % of it at 70B (1.061; bench/results/h200/sweep-llama3)
    "16384x14336x4096": "128x128_c1x2_pp_cs1_cl",  # 1.161 of GEMM-only
    "16384x28672x8192": "128x192_c2x1_pp",  # 1.098 of GEMM-only
}

swiglu_bwd_zdz = P.from_quack("quack.epilogue.library:dswiglu_dpreact_mod")


def run(inputs, prepared, config=None):
    # acc = dout @ w_down: B = w_down^T, (N=F, K=d)
    out = swiglu_bwd_zdz(inputs["dout"], inputs["w_down"].T, c=inputs["z"], config=config or P.pick_config(TUNED, inputs["dout"], inputs["w_down"].T))
    return {"dz": out["D"], "out": out["postact"], "zdz": P.finish.row_sum(out["dsum"])}
