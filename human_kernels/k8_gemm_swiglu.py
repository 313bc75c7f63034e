"""k8: SwiGLU on interleaved (gate, up) column pairs with quack's swiglu_mod; D keeps the
raw accumulator (the pre-activation the backward needs)."""

import primitives as P

TASK = "k8_gemm_swiglu"
AUTHOR = "quack library (CODA's authors)"

gate_up_swiglu = P.from_quack("quack.epilogue.library:swiglu_mod")


def run(inputs, prepared, config=None):
    out = gate_up_swiglu(inputs["a"], inputs["w_gu"], config=config)
    return {"z": out["D"], "out": out["postact"]}
