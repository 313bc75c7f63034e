"""k8: SwiGLU on the interleaved (gate, up) column pairs, in acc_pair mode: D keeps the raw
accumulator (the pre-activation z); "out" is the half-width SwiGLU."""

import primitives as P

TASK = "k8_gemm_swiglu"
SESSION = "20261130T184615Z-k8-a840f4"
BACKEND = "anthropic"
MODEL = "scripted-loopback-server"


@P.epilogue(outputs=("out",), mode="acc_pair")
def gate_up_swiglu(acc):
    gate, up = P.unpack(acc)  # even column: gate unit j, odd column: up unit j
    return {"out": P.swiglu(gate, up)}


def run(inputs, prepared, config=None):
    out = gate_up_swiglu(inputs["a"], inputs["w_gu"], config=config)
    return {"z": out["D"], "out": out["out"]}
