"""k4hf: fused QKV GEMM + deferred RMSNorm row scale + RoPE in Hugging Face's direction (+angle),
with quack's rstd_rope_posfreq_epi: acc * rstd[m], then q/k pairs rotate by
+pos[m] * inv_freq[j] (angle in float-float turns from a per-column frequency table; zero
frequency for the V columns, an exact identity)."""

import primitives as P

TASK = "k4hf_gemm_rmsnorm_rope"
SESSION = "20261207T214108Z-k4hf-2a99b1"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face, quack's own)

# light epilogue: k1's measured best configs for the same GEMMs (H200)
TUNED = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
}

rstd_rope = P.from_quack("quack.epilogue.rotary:rstd_rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate by +pos * inv_freq, v passes through (frequency 0)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w_qkv"]
    out = rstd_rope(h, w, pos=inputs["positions"], freq=prepared["freq"], rstd=inputs["rstd"],
                    config=config or P.pick_config(TUNED, h, w))
    return {"qkv": out["D"]}

