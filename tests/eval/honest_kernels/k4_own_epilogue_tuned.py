"""k4 written by hand: the row scale, then RoPE, with a TUNED table read through
P.pick_config, and a prepare() that builds P.prepare.qkv_rope_freq_table's table itself
(float64 turns, torch.stack, an outer product with @, torch.cat)."""

import math

import torch

import primitives as P
from primitives.config import DEFAULT_CONFIG, GemmConfig

TASK = "k4_gemm_rmsnorm_rope"
AUTHOR = "tests: honest kernels"

TUNED = {
    "16384x6144x2048": "128x192_c1x2_pp",
    "16384x12288x4096": "128x192_c2x1_pp",
    "16384x24576x8192": "128x128_c1x2_pp",
}


def frequency_table(inv_freq, d):
    """Per pair (hi, lo) = the float-float split of -inv_freq / (2 pi), in turns (k4 rotates
    by -angle, CODA v0.1's direction), for every q and k head; zeros (an exact identity) for
    the v columns."""
    turns = -inv_freq.double() / (2 * math.pi)
    hi = turns.float()
    lo = (turns - hi.double()).float()
    head = torch.stack((hi, lo), dim=-1).reshape(1, -1)  # (1, head_dim)
    heads = 2 * d // head.shape[1]
    rotary = (torch.ones(heads, 1) @ head).reshape(-1)  # the head's table, once per q and k head
    return torch.cat((rotary, rotary.new_zeros(d))).contiguous()


def prepare(consts):
    d = consts["w_qkv"].shape[1]
    table = frequency_table(consts["inv_freq"], d)
    assert table.shape == (3 * d,)
    return {"freq": table}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def rmsnorm_rope(acc, rstd, pos, freq):
    x1, x2 = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


def pick(a, w, config: GemmConfig | None = None) -> GemmConfig:
    if config is not None:
        return config
    chosen = P.pick_config(TUNED, a, w)
    return chosen if isinstance(chosen, GemmConfig) else DEFAULT_CONFIG


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = rmsnorm_rope(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"], config=pick(h, w, config))
    return {"qkv": out["D"]}
