"""k3 with its own RoPE epilogue: prepare() casts the frequencies and builds the table
through a helper that only prepare() calls."""

import torch

import primitives as P

TASK = "k3_gemm_rope"
AUTHOR = "tests: honest kernels"


def frequency_table(inv_freq, d):
    """Runs once per weight set (prepare scope): casts are fine here."""
    inv_freq = inv_freq.to(torch.float32).contiguous()
    return P.prepare.qkv_rope_freq_table(inv_freq.clone(), d=d, direction=-1)  # k3 rotates by -angle (CODA v0.1)


def prepare(consts):
    w_qkv = consts["w_qkv"]
    return {"freq": frequency_table(consts["inv_freq"].float(), w_qkv.shape[1])}


@P.epilogue(operands={"pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_rope(acc, pos, freq):
    x1, x2 = P.unpack(acc)
    r1, r2 = P.rope_rotate(x1, x2, pos, freq)
    return {"D": P.pack(r1, r2)}


def run(inputs, prepared, config=None):
    out = qkv_rope(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"], config=config)
    return {"qkv": out["D"]}
