"""r2b: Down-projection dgrad GEMM + squared-ReLU backward + bias gradient.

acc = dout @ w_down (the gradient at act = relu(h)^2); C is the saved pre-activation h.
Element mode: dh = acc * 2 relu(h) is D, act = relu(h)^2 an extra output, and db_up's
per-M-tile partials fold the float32 dh (before rounding) as a product (acc, 2 relu(h)):
0 where acc and h are 0, so ragged M tiles fold nothing extra. col_sum finishes db_up."""

import primitives as P

TASK = "r2b_gemm_relu2_bwd"
SESSION = "20261207T215656Z-r2b-c53c87"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Not measured for this epilogue: borrowed from the expert kernels at the same GEMM shapes
# (k7's down-projection dgrad: N = F, K = d, loads C and stores D plus one output), pingpong
# tiles for an epilogue that moves real data.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("act",), reductions={"db": P.ColReduce(product=True)})
def relu2_bwd(acc, c):
    r = P.relu(c)
    r2 = r + r
    return {"D": acc * r2, "act": r * r, "db": (acc, r2)}


def run(inputs, prepared, config=None):
    dout, w_down, h = inputs["dout"], inputs["w_down"], inputs["h"]
    w = w_down.T  # (N=F, K=d): the dgrad GEMM's B
    out = relu2_bwd(
        dout, w, c=h,
        dtypes={"D": h.dtype, "act": h.dtype},
        config=config or P.pick_config(TUNED, dout, w),
    )
    return {"dh": out["D"], "act": out["act"], "db_up": P.finish.col_sum(out["db"])}

