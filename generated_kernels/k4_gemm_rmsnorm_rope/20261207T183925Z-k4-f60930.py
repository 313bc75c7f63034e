"""k4: Fused QKV GEMM + deferred RMSNorm row scale + RoPE, with quack's
rstd_rope_posfreq_epi: each row is scaled by rstd[m] (completing the RMSNorm whose weight
is already in h), then the q and k pairs rotate by pos * freq, the angle computed in-kernel
in float-float turns from a per-column frequency table (zero for V columns, an exact
identity). quack rotates by +angle (Hugging Face's direction); the task follows CODA
v0.1's -angle, so the table holds -inv_freq."""

import primitives as P

TASK = "k4_gemm_rmsnorm_rope"
SESSION = "20261207T183925Z-k4-f60930"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# no configs measured on a GPU for this task yet: an empty table means DEFAULT_CONFIG
TUNED = {
}

qkv_rmsnorm_rope = P.from_quack("quack.epilogue.rotary:rstd_rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq: the task's rope_direction), v passes through
    # (both directions built once, a constant transform; run() picks the task's rope_direction)
    d = consts["w_qkv"].shape[1]
    return {"freq_-1": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=d, direction=-1),
            "freq_1": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=d, direction=1)}


def run(inputs, prepared, config=None):
    freq = prepared["freq_-1"] if inputs.get("rope_direction", ROPE_DIRECTION) < 0 else prepared["freq_1"]
    out = qkv_rmsnorm_rope(inputs["h"], inputs["w_qkv"], pos=inputs["positions"], freq=freq,
                           rstd=inputs["rstd"], config=config or P.pick_config(TUNED, inputs["h"], inputs["w_qkv"]))
    return {"qkv": out["D"]}

