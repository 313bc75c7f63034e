"""r2b: squared-ReLU backward in the down projection's dgrad epilogue. acc = dout @ w_down
(the gradient at act); C is the saved pre-activation h. dh = acc * 2 relu(h), act =
relu(h)^2 recomputed, and per-M-tile column partials of dh (float32, unrounded) for db_up,
folded by col_sum. dh vanishes where acc = 0 or h = 0, so ragged tiles fold nothing."""

import primitives as P

TASK = "r2b_gemm_relu2_bwd"
SESSION = "20261207T213703Z-r2b-42f4d9"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# No GPU measurement of this kernel here: the entries are the tile configs measured best
# for k7 (same GEMM shapes: dout @ w_down, C loaded, D and one output stored), a
# starting guess to be re-timed on a GPU.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("act",), reductions={"db": P.ColReduce()})
def relu2_bwd(acc, c):
    r = P.relu(c)
    dh = acc * (2.0 * r)
    return {"D": dh, "act": r * r, "db": dh}


def run(inputs, prepared, config=None):
    dout, w_down = inputs["dout"], inputs["w_down"]
    # acc = dout @ w_down: B = w_down^T, (N=F, K=d)
    cfg = config or P.pick_config(TUNED, dout, w_down.T)
    out = relu2_bwd(dout, w_down.T, c=inputs["h"], config=cfg,
                    dtypes={"D": dout.dtype, "act": dout.dtype})
    return {"dh": out["D"], "act": out["act"], "db_up": P.finish.col_sum(out["db"])}

