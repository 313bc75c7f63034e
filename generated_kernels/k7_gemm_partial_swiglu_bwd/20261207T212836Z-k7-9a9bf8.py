"""k7: down-projection dgrad GEMM + SwiGLU backward + ZdZ partials.

packed_pair mode: acc is the gradient at the SwiGLU output (one value per (gate, up) pair),
c is the saved interleaved pre-activation z. The epilogue writes dz interleaved like z,
recomputes out = silu(gate) * up, and folds per-tile partials of sum z * dz (from the
unrounded float32 dz) that P.finish.row_sum turns into zdz."""

import primitives as P

TASK = "k7_gemm_partial_swiglu_bwd"
SESSION = "20261207T212836Z-k7-9a9bf8"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# tile configs by GEMM m x n x k (pingpong 128x128 tiles; C-loading epilogues want the
# mainloop's A/B stages, hence one or two C stages).
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x128_c1x2_pp_cs1_cl",
}


@P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def swiglu_bwd_zdz(acc, c):
    gate, up = P.unpack(c)
    d_gate, d_up, out = P.dswiglu(gate, up, acc)
    # gate * d_gate + up * d_up is 0 where c and acc are 0: safe on ragged tiles
    return {"D": P.pack(d_gate, d_up), "out": out, "zdz": gate * d_gate + up * d_up}


def run(inputs, prepared, config=None):
    dout, w_down, z = inputs["dout"], inputs["w_down"], inputs["z"]
    # acc = dout @ w_down: the GEMM's B is w_down (d, F) stored (K, N), so pass its transpose
    cfg = config or P.pick_config(TUNED, dout, w_down.T)
    res = swiglu_bwd_zdz(dout, w_down.T, c=z, config=cfg, dtypes={"out": dout.dtype})
    return {"dz": res["D"], "out": res["out"], "zdz": P.finish.row_sum(res["zdz"])}

