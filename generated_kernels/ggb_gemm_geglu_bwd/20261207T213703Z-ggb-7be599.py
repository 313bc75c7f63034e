"""ggb: Down-projection dgrad GEMM + GeGLU backward.

acc = dout @ w_down is one gradient per (gate, up) pair, so the epilogue runs in packed_pair
mode: C is the saved interleaved z (16-bit pairs), D is dz packed the same way, and `out`
(M, F) is the recomputed gelu_tanh(gate) * up. All math in float32 from the unrounded
accumulator; each output rounded once at its store.

GELU's tanh form through the sigmoid: (1 + t)/2 = sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3),
and (1 - t^2)/2 = 2 s (1 - s), so
  gelu_tanh(x)  = x s
  gelu_tanh'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
"""

import math

import primitives as P

TASK = "ggb_gemm_geglu_bwd"
SESSION = "20261207T213703Z-ggb-7be599"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715

# Tile configs by GEMM m x n x k. This epilogue has k7's shape (C pairs in, packed D and one
# (M, F) output out, same GEMM sizes) minus its row reduction: k7's H200-measured picks.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="packed_pair")
def geglu_bwd(acc, c):
    gate, up = P.unpack(c)
    g2 = gate * gate
    u = gate * (_K0 + (_K0 * _K1) * g2)           # sqrt(2/pi) (x + 0.044715 x^3)
    s = P.sigmoid(2.0 * u)                          # (1 + tanh(u)) / 2
    gelu = gate * s
    dgelu = s + (2.0 * _K0) * gate * (s - s * s) * (1.0 + (3.0 * _K1) * g2)
    return {"D": P.pack(acc * up * dgelu, acc * gelu), "out": gelu * up}


def run(inputs, prepared, config=None):
    dout, w_down, z = inputs["dout"], inputs["w_down"], inputs["z"]
    b = w_down.T  # dgrad: acc = dout @ w_down, B = w_down^T as (N=F, K=d)
    res = geglu_bwd(
        dout, b, c=z,
        config=config or P.pick_config(TUNED, dout, b),
        dtypes={"out": dout.dtype},
    )
    return {"dz": res["D"], "out": res["out"]}

