"""qkn: Qwen3's QK-norm and RoPE in the Q/K projection's epilogue. P.HeadRMS is each
head's statistic, folded by quack's HeadRstd prepass from the unrounded accumulator; the
norm weights come as one per-column table (q_norm repeated over the q heads, k_norm over
the k heads), then the pairs rotate as in k3hf."""

import torch

import primitives as P

TASK = "qkn_gemm_qknorm_rope"
AUTHOR = "epiforge maintainers"
EPS = 1e-6  # the task's scalar eps
# HeadRMS needs whole heads per tile: tile_n a multiple of head_dim (not timed on the H200 yet)
CONFIGS = {64: P.GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True),
           128: P.GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True),
           256: P.GemmConfig(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1, pingpong=False)}


# one epilogue per head width: HeadRMS's head_dim is part of the compiled kernel
@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=64, eps=EPS), "w": P.PerCol(), "pos": P.PerRow(),
                      "freq": P.PerCol()}, mode="acc_pair")
def qk_norm_rope_64(acc, rstd, w, pos, freq):
    x1, x2 = P.unpack(acc * rstd * w)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=128, eps=EPS), "w": P.PerCol(), "pos": P.PerRow(),
                      "freq": P.PerCol()}, mode="acc_pair")
def qk_norm_rope(acc, rstd, w, pos, freq):
    x1, x2 = P.unpack(acc * rstd * w)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=256, eps=EPS), "w": P.PerCol(), "pos": P.PerRow(),
                      "freq": P.PerCol()}, mode="acc_pair")
def qk_norm_rope_256(acc, rstd, w, pos, freq):
    x1, x2 = P.unpack(acc * rstd * w)
    return {"D": P.pack(*P.rope_rotate(x1, x2, pos, freq))}


EPILOGUES = {64: qk_norm_rope_64, 128: qk_norm_rope, 256: qk_norm_rope_256}


def prepare(consts):
    d = consts["w_qk"].shape[1]
    head_dim = consts["q_norm_weight"].shape[0]
    heads = d // head_dim
    weight = torch.cat([consts["q_norm_weight"].float().repeat(heads), consts["k_norm_weight"].float().repeat(heads)])
    freq = P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d, direction=1)
    return {"w": weight, "freq": freq}


def run(inputs, prepared, config=None):
    head_dim = 2 * inputs["inv_freq"].shape[0]
    out = EPILOGUES[head_dim](inputs["a"], inputs["w_qk"], w=prepared["w"], pos=inputs["positions"],
                              freq=prepared["freq"], config=config or CONFIGS[head_dim])
    return {"qk": out["D"]}
