"""k7 with its own packed_pair epilogue (P.dswiglu), inputs read through aliases, and the
result dict filled in a loop (a fresh local: writing into it is fine)."""

import primitives as P

TASK = "k7_gemm_partial_swiglu_bwd"
AUTHOR = "tests: honest kernels"


@P.epilogue(outputs=("out",), reductions={"zdz": P.RowReduce()}, mode="packed_pair")
def swiglu_bwd(acc, c):
    gate, up = P.unpack(c)
    d_gate, d_up, out = P.dswiglu(gate, up, acc)
    return {"D": P.pack(d_gate, d_up), "out": out, "zdz": gate * d_gate + up * d_up}


def run(inputs, prepared, config=None):
    dout = inputs["dout"]
    w_down = inputs["w_down"]
    b = w_down.T  # (F, d): the dgrad GEMM's B
    z = inputs["z"]
    m, f = dout.shape[0], b.shape[0]
    assert z.shape == (m, 2 * f), "z holds the (gate, up) pairs"
    out = swiglu_bwd(dout, b, c=z, config=config)
    result = {}
    for name, key in (("dz", "D"), ("out", "out")):
        result[name] = out[key]
    result["zdz"] = P.finish.row_sum(out["zdz"])
    return result
