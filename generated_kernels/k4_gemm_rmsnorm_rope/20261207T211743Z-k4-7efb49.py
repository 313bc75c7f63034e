"""k4: Fused QKV GEMM + deferred RMSNorm row scale + RoPE. The epilogue completes the
RMSNorm (acc * rstd[m], in float32 on the unrounded accumulator), then rotates each
adjacent (2j, 2j+1) pair of q and k by -positions[m] * inv_freq[j] (CODA v0.1's direction)
with P.rope_rotate on a per-column frequency table; v columns get frequency 0 (an exact
identity), so they pass through scaled only. One rounding to the inputs' dtype at the store."""

import primitives as P

TASK = "k4_gemm_rmsnorm_rope"
SESSION = "20261207T211743Z-k4-7efb49"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
AUTHOR = "agent"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# same GEMMs as k1 (row scale) and k3 (rotation); k1's measured best on the H200
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_rmsnorm_rope(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq), v passes through (frequency 0)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = qkv_rmsnorm_rope(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                           dtypes={"D": h.dtype}, config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["D"]}

