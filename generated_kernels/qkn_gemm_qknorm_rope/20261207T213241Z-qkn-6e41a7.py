"""qkn: Q/K projection GEMM + per-head QK-norm + RoPE (Qwen3), one fused GEMM launch.

acc_pair epilogue: P.HeadRMS folds acc**2 over each head's head_dim columns from the
unrounded float32 accumulator (quack's HeadRstd prepass); each pair (2j, 2j+1) is then
scaled by its (row, head) rstd and by the head's norm weight (q_norm over the q heads,
k_norm over the k heads: a PerCol table built in prepare()), and rotated with
P.rope_rotate by pos * inv_freq (float-float turns table). The rotation's sign comes from
the scalar rope_direction (+1 for Hugging Face / Qwen3), multiplied into the position
(an exact sign flip), so one compiled kernel serves either direction.
"""

import torch
import primitives as P

TASK = "qkn_gemm_qknorm_rope"
SESSION = "20261207T213241Z-qkn-6e41a7"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"

EPS = 1e-6  # the task's eps (HeadRMS takes it at declaration)


_OPS = {"nw": P.PerCol(), "pos": P.PerRow(), "freq": P.PerCol(), "direction": P.Scalar()}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=128, eps=EPS), **_OPS}, mode="acc_pair")
def qknorm_rope_hd128(acc, rstd, nw, pos, freq, direction):
    x, y = P.unpack(acc * rstd * nw)
    return {"D": P.pack(*P.rope_rotate(x, y, pos * direction, freq))}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=64, eps=EPS), **_OPS}, mode="acc_pair")
def qknorm_rope_hd64(acc, rstd, nw, pos, freq, direction):
    x, y = P.unpack(acc * rstd * nw)
    return {"D": P.pack(*P.rope_rotate(x, y, pos * direction, freq))}


@P.epilogue(operands={"rstd": P.HeadRMS(head_dim=256, eps=EPS), **_OPS}, mode="acc_pair")
def qknorm_rope_hd256(acc, rstd, nw, pos, freq, direction):
    x, y = P.unpack(acc * rstd * nw)
    return {"D": P.pack(*P.rope_rotate(x, y, pos * direction, freq))}


_EPIS = {64: qknorm_rope_hd64, 128: qknorm_rope_hd128, 256: qknorm_rope_hd256}

# tile_n must hold whole heads: 128-column pingpong tiles for head_dim 64 / 128,
# a 256-column cooperative tile for head_dim 256.
_DEFAULT = {
    64: P.GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True),
    128: P.GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True),
    256: P.GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, pingpong=False),
}


def prepare(consts):
    w_qk = consts["w_qk"]
    d = w_qk.shape[1]
    head_dim = consts["q_norm_weight"].shape[0]
    heads = d // head_dim
    # per-column norm weight over [q heads | k heads], float32 (exact from bf16 / fp16)
    nw = torch.cat((consts["q_norm_weight"].float().repeat(heads), consts["k_norm_weight"].float().repeat(heads)))
    freq = P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d)
    return {"nw": nw.contiguous(), "freq": freq}


def run(inputs, prepared, config=None):
    head_dim = inputs["q_norm_weight"].shape[0]
    epi = _EPIS[head_dim]
    cfg = config or _DEFAULT[head_dim]
    out = epi(
        inputs["a"],
        inputs["w_qk"],
        nw=prepared["nw"],
        pos=inputs["positions"],
        freq=prepared["freq"],
        direction=inputs["rope_direction"],
        config=cfg,
        dtypes={"D": inputs["a"].dtype},
    )
    return {"qk": out["D"]}

