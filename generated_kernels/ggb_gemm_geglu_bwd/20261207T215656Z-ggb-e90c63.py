"""ggb: Down-projection dgrad GEMM + GeGLU backward, fused in the dgrad epilogue.

acc = dout @ w_down (one gradient per (gate, up) pair); c is the saved interleaved z
(packed_pair mode), D is dz packed like z, and "out" recomputes gelu_tanh(gate) * up.

gelu_tanh(x) = x * s with s = sigmoid(2 u), u = sqrt(2/pi) (x + 0.044715 x^3), since
(1 + tanh(u)) / 2 = sigmoid(2 u) and 1 - tanh(u)^2 = 4 s (1 - s), so
gelu_tanh'(x) = s + x s (1 - s) * 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2).
"""

import math

import primitives as P

TASK = "ggb_gemm_geglu_bwd"
SESSION = "20261207T215656Z-ggb-e90c63"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

_C1 = 2.0 * math.sqrt(2.0 / math.pi)  # 2 sqrt(2/pi)
_C2 = _C1 * 0.044715                  # 2 sqrt(2/pi) * 0.044715
_C3 = 3.0 * _C2                       # 2 sqrt(2/pi) * 3 * 0.044715

# The same GEMM shapes and the same epilogue shape (packed_pair, C loaded, D + one (M, F)
# output) as k7's SwiGLU backward: its H200-measured tile configs.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("out",), mode="packed_pair")
def geglu_bwd(acc, c):
    gate, up = P.unpack(c)
    g2 = gate * gate
    s = P.sigmoid(gate * (_C1 + _C2 * g2))        # (1 + tanh(u)) / 2
    gelu = gate * s                                # gelu_tanh(gate)
    dgelu = s + gelu * (1.0 - s) * (_C1 + _C3 * g2)  # gelu_tanh'(gate)
    return {"D": P.pack(acc * up * dgelu, acc * gelu), "out": gelu * up}


def run(inputs, prepared, config=None):
    dout, w_down = inputs["dout"], inputs["w_down"]
    w = w_down.T  # dgrad: acc = dout @ w_down, B (N=F, K=d)
    res = geglu_bwd(dout, w, c=inputs["z"], config=config or P.pick_config(TUNED, dout, w),
                    dtypes={"out": dout.dtype})
    return {"dz": res["D"], "out": res["out"]}

