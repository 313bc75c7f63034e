"""k3hf: fused QKV GEMM + RoPE on q and k in Hugging Face's direction (+angle), with quack's
rope_posfreq_epi as it is. The frequency table (built once in prepare) holds +inv_freq for the
q and k columns and 0 for the v columns (an exact identity), so one acc_pair epilogue rotates
q and k and passes v through."""

import primitives as P

TASK = "k3hf_gemm_rope"
SESSION = "20261207T214644Z-k3hf-ab5ce5"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face, quack's own)

# no measured configs for this task: the default (pick_config's fallback)
TUNED = {
}

qkv_rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate by +pos * inv_freq, v passes through (frequency 0)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rope(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"],
                   config=config or P.pick_config(TUNED, inputs["a"], inputs["w_qkv"]))
    return {"qkv": out["D"]}

