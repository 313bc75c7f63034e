"""k7: Down-projection dgrad GEMM + SwiGLU backward + ZdZ partials.

acc = dout @ w_down (one gradient per (gate, up) pair); packed_pair mode reads the saved
interleaved z as C. The epilogue writes dz = (d_gate, d_up) interleaved like z (D),
recomputes out = silu(gate) * up, and keeps per-tile partials of sum z * dz from the
unrounded float32 values (0 where c and acc are 0, so ragged tiles are safe); row_sum folds
them into zdz."""

import primitives as P

TASK = "k7_gemm_partial_swiglu_bwd"
SESSION = "20261207T215318Z-k7-e74a49"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Configs from the H200/H100 logs for this epilogue (C, D and postact at 128x128 pingpong;
# one C stage gives the mainloop its sixth A/B stage; the C-load warp won at 7B).
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x128_c1x2_pp_cs1_cl",
}


@P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def swiglu_bwd_zdz(acc, c):
    gate, up = P.unpack(c)
    d_gate, d_up, out = P.dswiglu(gate, up, acc)
    return {"D": P.pack(d_gate, d_up), "out": out, "zdz": gate * d_gate + up * d_up}


def run(inputs, prepared, config=None):
    dout, w_down, z = inputs["dout"], inputs["w_down"], inputs["z"]
    w = w_down.T  # dgrad: B is w_down (d, F) read as (N=F, K=d)
    res = swiglu_bwd_zdz(
        dout, w, c=z, dtypes={"out": dout.dtype},
        config=config or P.pick_config(TUNED, dout, w),
    )
    return {"dz": res["D"], "out": res["out"], "zdz": P.finish.row_sum(res["zdz"])}

