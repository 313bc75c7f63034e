"""qkn: Q/K projection GEMM + per-head QK-norm + RoPE (Qwen3), one fused GEMM epilogue.

acc_pair mode: each adjacent column pair (2j, 2j+1) of a head arrives as one pair. The
head's statistic rsqrt(mean(acc**2) + eps) comes from P.HeadRMS (quack's HeadRstd prepass
over the unrounded float32 accumulator), the norm weight is a PerCol table (q_norm for the
q heads, k_norm for the k heads; float32, an exact upcast of the inputs' dtype), and RoPE
rotates by +positions * inv_freq (Hugging Face) with P.rope_rotate on a float-float turns
table. Output D follows a's dtype (one rounding)."""

import torch
import primitives as P

TASK = "qkn_gemm_qknorm_rope"
SESSION = "20261207T131952Z-qkn-c91670"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
AUTHOR = "agent"

EPS = 1e-6  # the task's eps; HeadRMS compiles it in (another value builds another epilogue)


def _make_epi(head_dim, eps, direction):
    ops = {"rstd": P.HeadRMS(head_dim=head_dim, eps=eps), "nw": P.PerCol(), "pos": P.PerRow(), "freq": P.PerCol()}
    if direction > 0:
        @P.epilogue(operands=ops, mode="acc_pair")
        def qknorm_rope(acc, rstd, nw, pos, freq):
            x, y = P.unpack(acc * rstd * nw)
            return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}
    else:
        # rotation by -t = swap . rotation by +t . swap (a reflection conjugates a rotation)
        @P.epilogue(operands=ops, mode="acc_pair")
        def qknorm_rope(acc, rstd, nw, pos, freq):
            x, y = P.unpack(acc * rstd * nw)
            r2, r1 = P.rope_rotate(y, x, pos, freq)
            return {"D": P.pack(r1, r2)}
    return qknorm_rope


_EPIS = {hd: _make_epi(hd, EPS, 1) for hd in (64, 128, 256)}


def prepare(consts):
    w = consts["w_qk"]
    d = w.shape[1]
    qn, kn = consts["q_norm_weight"], consts["k_norm_weight"]
    head_dim = qn.shape[0]
    heads = d // head_dim
    nw = torch.cat((qn.float().repeat(heads), kn.float().repeat(heads))).contiguous()
    freq = P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d, direction=1)
    return {"nw": nw, "freq": freq}


def _config(head_dim):
    if 128 % head_dim == 0:
        return P.GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True)
    return P.GemmConfig(tile_m=128, tile_n=256, cluster_m=1, cluster_n=1, pingpong=False)


def run(inputs, prepared, config=None):
    head_dim = inputs["q_norm_weight"].shape[0]
    eps = float(inputs.get("eps", EPS))
    direction = float(inputs.get("rope_direction", 1.0))
    if eps == EPS and direction > 0 and head_dim in _EPIS:
        epi = _EPIS[head_dim]
    else:
        epi = _make_epi(head_dim, eps, direction)
    out = epi(inputs["a"], inputs["w_qk"], nw=prepared["nw"], pos=inputs["positions"],
              freq=prepared["freq"], config=config or _config(head_dim))
    return {"qk": out["D"]}

