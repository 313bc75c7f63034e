"""k4hf: fused QKV GEMM + deferred RMSNorm row scale + RoPE in Hugging Face's direction (+angle).

One acc_pair epilogue: each adjacent column pair (2j, 2j+1) of the float32 accumulator is
scaled by the row's rstd, then rotated by +positions[m] * inv_freq[j] with P.rope_rotate on a
per-column frequency table (float-float turns; zero for the V columns, an exact identity, so
v = rstd * acc). One rounding, to the inputs' dtype (D follows a's dtype)."""

import primitives as P

TASK = "k4hf_gemm_rmsnorm_rope"
SESSION = "20261207T211008Z-k4hf-9ac66f"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face, quack's own)

# Not measured for this epilogue: k1's measured H200 configs for the same GEMMs (k1 is this
# kernel without the rotation; the log reports light epilogues like k4 follow the GEMM at
# 128x128 pingpong). pick_config takes the nearest entry for the 70B shape.
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
}


@P.epilogue(operands={"rstd": P.PerRow(), "pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def rstd_rope(acc, rstd, pos, freq):
    x, y = P.unpack(acc * rstd)
    return {"D": P.pack(*P.rope_rotate(x, y, pos, freq))}


def prepare(consts):
    # w_qkv is (3d, d) rows [q; k; v]: q and k rotate by +pos * inv_freq, v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = rstd_rope(h, w, rstd=inputs["rstd"], pos=inputs["positions"], freq=prepared["freq"],
                    config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["D"]}

