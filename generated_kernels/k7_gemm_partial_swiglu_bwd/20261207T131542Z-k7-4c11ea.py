"""k7: Down-projection dgrad GEMM + SwiGLU backward + ZdZ partials.

packed_pair epilogue: acc = dout @ w_down (one gradient per (gate, up) pair), c = z (the
saved interleaved pre-activation). D = dz = pack(d_gate, d_up) in z's dtype, "out" the
recomputed silu(gate) * up, and per-tile float32 partials of gate*d_gate + up*d_up (from
the unrounded float32 dz; 0 where acc and c are 0, so ragged tiles are safe), folded by
P.finish.row_sum."""

import primitives as P

TASK = "k7_gemm_partial_swiglu_bwd"
SESSION = "20261207T131542Z-k7-4c11ea"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Tile configs by GEMM m x n x k. Not measured in this session (no GPU here): taken from the
# H200 numbers quoted in docs/gemm_config.md for this epilogue (128x128 pingpong: 1.22x of
# GEMM-only at the 1B shape with quack's default C stages; at 7B one C stage won, 1.07x
# against 1.10x). The nearest entry is used for other shapes; re-measure before trusting.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp",
    "16384x11008x4096": "128x128_c1x2_pp_cs1",
    "16384x22016x8192": "128x128_c1x2_pp_cs1",
}


@P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce(product=True)}, mode="packed_pair")
def swiglu_bwd(acc, c):
    gate, up = P.unpack(c)
    s = P.sigmoid(gate)
    silu = gate * s
    t = s * (1.0 + gate * (1.0 - s))  # d silu / d gate
    d_gate = acc * up * t
    d_up = acc * silu
    # z . dz over the pair: gate*d_gate + up*d_up = acc * up * (gate*t + silu), folded as one FMA
    return {"D": P.pack(d_gate, d_up), "out": silu * up, "zdz": (acc, up * (gate * t + silu))}


def run(inputs, prepared, config=None):
    w_down = inputs["w_down"]  # (d, F): the dgrad GEMM's B is its transpose, (N=F, K=d)
    cfg = config or P.pick_config(TUNED, inputs["dout"], w_down.T)
    res = swiglu_bwd(inputs["dout"], w_down.T, c=inputs["z"], config=cfg,
                     dtypes={"out": inputs["dout"].dtype})
    return {"dz": res["D"], "out": res["out"], "zdz": P.finish.row_sum(res["zdz"])}

