"""k3hf: Fused QKV GEMM + RoPE on Q and K in Hugging Face's direction (+angle), quack's
rope_posfreq_epi as it is: q and k pairs rotate by +positions[m] * inv_freq[j], v passes
through (frequency 0 in the table, an exact identity)."""

import primitives as P

TASK = "k3hf_gemm_rope"
SESSION = "20261207T193049Z-k3hf-2e0e2f"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = 1  # the task's scalar rope_direction (Hugging Face, quack's own)

TUNED = {
}

qkv_rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by +pos * inv_freq), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rope(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"],
                   config=config or P.pick_config(TUNED, inputs["a"], inputs["w_qkv"]))
    return {"qkv": out["D"]}

