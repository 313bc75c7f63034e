"""k2: row scale by rstd, then SwiGLU on the interleaved (gate, up) column pairs; D keeps
the scaled pre-activation for the backward."""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
AUTHOR = "epiforge maintainers"

# measured best tile configs on the H200 by GEMM m x n x k, written by
# python -m bench.tuning --write from:
#   bench/results/h200/sweep.json bench/results/h200/sweep-cs.json
#   bench/results/h200/sweep-c8.json bench/results/h200/confirm.json
TUNED = {
    "16384x11264x2048": "128x160_c2x1_pp",  # 1.003 of GEMM-only
    "16384x22016x4096": "128x128_c2x1_pp",  # 1.005 of GEMM-only
    "16384x44032x8192": "128x128_c2x1_pp",  # 1.001 of GEMM-only
    # LLaMA-3.2-1B's shape (bench/run.py --shape-set llama1b, bench/results/h200/sweep-llama1b.json)
    "16384x16384x2048": "128x192_c2x1_pp",  # the default: no config beat it beyond the noise (1522 us; the best, 1508)
    # LLaMA-3's 8B and 70B layers (bench/run.py --shape-set llama3): the H100's fastest
    # (bench/results/h100/sweep-llama3); on the H200 within 1.3 % of the fastest (1.010,
    # 1.013; bench/results/h200/sweep-llama3)
    "16384x28672x4096": "128x192_c2x1_pp",  # 1.001 of GEMM-only
    "16384x57344x8192": "128x192_c2x1_pp",  # 1.002 of GEMM-only
}


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rmsnorm_swiglu(acc, rstd):
    gate, up = P.unpack(acc * rstd)
    return {"D": P.pack(gate, up), "out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    out = rmsnorm_swiglu(inputs["h"], inputs["w_gu"], rstd=inputs["rstd"], config=config or P.pick_config(TUNED, inputs["h"], inputs["w_gu"]))
    return {"z": out["D"], "out": out["out"]}
