"""k4: Fused QKV GEMM + deferred RMSNorm row scale + RoPE.

The GEMM reads h = x * norm_weight; the epilogue (acc_pair mode, one pair = the adjacent
columns (2j, 2j+1) of a head) completes the RMSNorm with the per-row rstd, then rotates the
pair by pos[m] * freq[j]. The frequency table (built once in prepare) holds -inv_freq for
the q and k columns (the task's rope_direction = -1, CODA v0.1) and 0 for the v columns,
an exact identity, so v is just rstd * acc. Everything stays in float32 until D is rounded
once to h's dtype.
"""

import primitives as P

TASK = "k4_gemm_rmsnorm_rope"
SESSION = "20261207T214644Z-k4-cdbd00"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# Not measured for this epilogue: k1's H200-measured best configs for the same GEMMs
# (16384 x 3d x d; k1 is this row scale without the rotation, k3 this rotation without it).
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
    "16384x24576x8192": "128x128_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def rmsnorm_rope(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d), rows [q; k; v]: q and k rotate (by -pos * inv_freq), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = rmsnorm_rope(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                       config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["D"]}

