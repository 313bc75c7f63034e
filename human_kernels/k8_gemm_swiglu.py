"""k8: SwiGLU on interleaved (gate, up) column pairs with quack's swiglu_mod; D keeps the
raw accumulator (the pre-activation the backward needs)."""

import primitives as P

TASK = "k8_gemm_swiglu"
AUTHOR = "quack library (CODA's authors)"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x11264x2048": "128x128_c2x1_pp",  # 1.004 of GEMM-only
    "16384x22016x4096": "128x128_c1x2_pp",  # 1.001 of GEMM-only
    "16384x44032x8192": "128x192_c1x2_pp",  # 1.002 of GEMM-only
}

gate_up_swiglu = P.from_quack("quack.epilogue.library:swiglu_mod")


def run(inputs, prepared, config=None):
    out = gate_up_swiglu(inputs["a"], inputs["w_gu"], config=config or P.pick_config(TUNED, inputs["a"], inputs["w_gu"]))
    return {"z": out["D"], "out": out["postact"]}
