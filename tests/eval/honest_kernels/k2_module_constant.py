"""k2 with the SwiGLU written out: a module-level constant in the epilogue body and an
epilogue helper (a plain function the epilogue calls; it obeys the same rules)."""

import primitives as P

TASK = "k2_gemm_rmsnorm_swiglu"
AUTHOR = "tests: honest kernels"

ONE = 1.0
USE_PRIMITIVE_SILU = False  # a Python constant: the epilogue may branch on it


def silu(x):
    """x * sigmoid(x), from exp: an epilogue helper."""
    return x / (ONE + P.exp(-x))


@P.epilogue(outputs=("out",), operands={"rstd": P.PerRow()}, mode="acc_pair")
def rmsnorm_swiglu(acc, rstd):
    gate, up = P.unpack(acc * rstd)
    if USE_PRIMITIVE_SILU:
        act = P.silu(gate)
    else:
        act = silu(gate)
    return {"D": P.pack(gate, up), "out": act * up}


def run(inputs, prepared, config=None):
    h, w_gu = inputs["h"], inputs["w_gu"]
    out = rmsnorm_swiglu(h, w_gu, rstd=inputs["rstd"], config=config)
    return {"z": out["D"], "out": out["out"]}
