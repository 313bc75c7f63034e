"""ggb: Down-projection dgrad GEMM + GeGLU backward, fused in one packed_pair epilogue.

acc = dout @ w_down (one gradient per (gate, up) pair); c = the saved interleaved z.
With s = sigmoid(2u), u = sqrt(2/pi) (g + 0.044715 g^3):  tanh(u) = 2s - 1, so
  gelu_tanh(g)  = g * s
  gelu_tanh'(g) = s + 2 g s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
one exp per pair. D = pack(acc * up * gelu', acc * gelu), out = gelu * up.
"""

import math

import primitives as P

TASK = "ggb_gemm_geglu_bwd"
SESSION = "20261207T203906Z-ggb-7afc7e"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

_K0 = math.sqrt(2.0 / math.pi)
_K1 = 0.044715

# The GEMMs are k7's (same M x F x d and the same I/O: packed 16-bit C, packed D, one
# (M, F) output); these are k7's configs measured on the H200 at those shapes, not
# re-measured for the GeGLU math.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="packed_pair")
def geglu_bwd(acc, c):
    gate, up = P.unpack(c)
    g2 = gate * gate
    u2 = (2.0 * _K0) * gate * (1.0 + _K1 * g2)          # 2u
    s = P.sigmoid(u2)                                    # (1 + tanh(u)) / 2
    gelu = gate * s
    dgelu = s + (2.0 * _K0) * gate * s * (1.0 - s) * (1.0 + (3.0 * _K1) * g2)
    return {"D": P.pack(acc * up * dgelu, acc * gelu), "out": gelu * up}


def run(inputs, prepared, config=None):
    dout, w_t = inputs["dout"], inputs["w_down"].T   # B = w_down^T: (N=F, K=d)
    res = geglu_bwd(dout, w_t, c=inputs["z"], config=config or P.pick_config(TUNED, dout, w_t))
    return {"dz": res["D"], "out": res["out"]}

