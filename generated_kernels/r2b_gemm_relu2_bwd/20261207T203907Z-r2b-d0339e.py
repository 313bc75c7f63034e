"""r2b: Down-projection dgrad GEMM + squared-ReLU backward + bias gradient.

acc = dout @ w_down (the gradient at act = relu(h)^2). The saved pre-activation h rides the
GEMM's C path; the epilogue stores D = dh = acc * 2 relu(h), the extra output act = relu(h)^2,
and folds per-M-tile column partials of dh (float32, unrounded: a fused multiply-add of acc
and 2 relu(h)), which col_sum folds into db_up. Every folded term is 0 where acc and h are 0,
so ragged last tiles add nothing.
"""

import primitives as P

TASK = "r2b_gemm_relu2_bwd"
SESSION = "20261207T203907Z-r2b-d0339e"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

# Not measured for this epilogue: borrowed from k7 (the SwiGLU backward at the same dgrad
# GEMM shapes, also C-loading with two 16-bit stores per tile, measured on the H200), the
# nearest thing measured. Replace with this kernel's own sweep when a GPU is at hand.
TUNED = {
    "16384x5632x2048": "128x128_c1x2_pp_cs2",
    "16384x11008x4096": "128x128_c1x2_pp_cs1_cl",
    "16384x22016x8192": "128x192_c2x1_pp",
}


@P.epilogue(outputs=("act",), reductions={"db": P.ColReduce(product=True)})
def relu2_bwd(acc, c):
    r = P.relu(c)
    g = r * 2.0
    return {"D": acc * g, "act": r * r, "db": (acc, g)}


def run(inputs, prepared, config=None):
    dout, w_down, h = inputs["dout"], inputs["w_down"], inputs["h"]
    b = w_down.T  # (N=F, K=d) view: acc = dout @ w_down
    dt = dout.dtype
    out = relu2_bwd(
        dout, b, c=h, dtypes={"D": dt, "act": dt},
        config=config or P.pick_config(TUNED, dout, b),
    )
    return {"dh": out["D"], "act": out["act"], "db_up": P.finish.col_sum(out["db"])}

