"""qkn: Q/K projection GEMM + per-head QK-norm (Qwen3) + RoPE, in one fused GEMM epilogue.

acc_pair mode: each pair is one rotary pair (2j, 2j+1) of a head. P.HeadRMS gives the
(row, head) reciprocal RMS of the unrounded float32 accumulator (quack's HeadRstd prepass);
the per-column norm weight (q_norm repeated over the q heads, then k_norm over the k heads,
float32) scales it, and P.rope_rotate turns the pair by positions[m] * inv_freq[j] (the
frequency table built once in prepare(); the task's rope_direction multiplies the position,
an exact +-1). One rounding, to the inputs' dtype, at the store.
"""

import torch

import primitives as P

TASK = "qkn_gemm_qknorm_rope"
SESSION = "20261207T215645Z-qkn-6849b4"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
AUTHOR = "agent"

# tile_n must hold whole heads (head_dim 128): 128-column pingpong tiles. Not measured on a
# GPU here: the 128x128 pingpong tile the paired epilogues start from (docs/logs).
TUNED = {
    "16384x4096x2048": "128x128_c1x2_pp",
    "16384x8192x4096": "128x128_c1x2_pp",
    "16384x16384x8192": "128x128_c1x2_pp",
}


def _make(head_dim, eps):
    @P.epilogue(operands={"rstd": P.HeadRMS(head_dim=head_dim, eps=eps), "nw": P.PerCol(), "pos": P.PerRow(),
                          "freq": P.PerCol(), "direction": P.Scalar()}, mode="acc_pair")
    def qk_norm_rope(acc, rstd, nw, pos, freq, direction):
        x, y = P.unpack(acc * rstd * nw)
        return {"D": P.pack(*P.rope_rotate(x, y, pos * direction, freq))}

    return qk_norm_rope


# built once at import, one per head_dim a Qwen-style model uses (eps 1e-6, Qwen3's)
_EPIS = {(hd, 1e-6): _make(hd, 1e-6) for hd in (64, 128, 256)}


def prepare(consts):
    w = consts["w_qk"]
    d = w.shape[1]
    qn, kn = consts["q_norm_weight"], consts["k_norm_weight"]
    head_dim = qn.shape[0]
    heads = d // head_dim
    nw = torch.cat((qn.float().repeat(heads), kn.float().repeat(heads)))
    freq = P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d)
    return {"nw": nw, "freq": freq}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_qk"]
    head_dim = inputs["q_norm_weight"].shape[0]
    eps = float(inputs["eps"])
    epi = _EPIS.get((head_dim, eps)) or _make(head_dim, eps)
    cfg = config or P.pick_config(TUNED, a, w)
    if cfg.tile_n % head_dim != 0:
        cfg = P.GemmConfig(tile_m=128, tile_n=head_dim if head_dim <= 208 else 256, cluster_m=cfg.cluster_m,
                           cluster_n=cfg.cluster_n, pingpong=head_dim <= 208)
    out = epi(a, w, nw=prepared["nw"], pos=inputs["positions"], freq=prepared["freq"],
              direction=float(inputs["rope_direction"]), config=cfg, dtypes={"D": a.dtype})
    return {"qk": out["D"]}

