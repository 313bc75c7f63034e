"""qkn: Qwen3's QK-norm and RoPE in the Q/K projection's epilogue. P.HeadRMS is each
head's statistic, folded by quack's HeadRstd prepass from the unrounded accumulator; the
norm weights come as one per-column table (q_norm repeated over the q heads, k_norm over
the k heads), then the pairs rotate as in k3hf."""

import torch

import primitives as P

TASK = "qkn_gemm_qknorm_rope"
AUTHOR = "epiforge maintainers"
HEAD_DIM = 128  # every shape set's head_dim
EPS = 1e-6  # the task's scalar eps
# HeadRMS needs whole heads per tile: tile_n a multiple of HEAD_DIM (not timed on the H200 yet)
CONFIG = P.GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True)


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=HEAD_DIM, eps=EPS), "w": P.PerCol(), "pos": P.PerRow(),
                      "freq": P.PerCol()}, mode="acc_pair")
def qk_norm_rope(acc, rstd, w, pos, freq):
    x1, x2 = P.unpack(acc * rstd * w)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


def prepare(consts):
    d = consts["w_qk"].shape[1]
    heads = d // HEAD_DIM
    weight = torch.cat([consts["q_norm_weight"].float().repeat(heads), consts["k_norm_weight"].float().repeat(heads)])
    freq = P.prepare.rope_freq_table(consts["inv_freq"], HEAD_DIM, rotary_cols=2 * d, direction=1)
    return {"w": weight, "freq": freq}


def run(inputs, prepared, config=None):
    out = qk_norm_rope(inputs["a"], inputs["w_qk"], w=prepared["w"], pos=inputs["positions"], freq=prepared["freq"],
                       config=config or CONFIG)
    return {"qk": out["D"]}
