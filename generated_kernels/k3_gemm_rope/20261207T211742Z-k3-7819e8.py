"""k3: fused QKV GEMM + RoPE on Q and K. quack's rope_posfreq_epi (acc_pair mode: each pair
(2j, 2j+1) rotated by pos[m] * freq[j]). quack rotates by +angle; the task's rope_direction
(-1, CODA v0.1) goes into the frequency table (-inv_freq), and the v columns get frequency
0, an exact pass-through."""

import primitives as P

TASK = "k3_gemm_rope"
SESSION = "20261207T211742Z-k3-7819e8"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

TUNED = {
}

qkv_rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate, v passes through (frequency 0)
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                   direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rope(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"],
                   config=config or P.pick_config(TUNED, inputs["a"], inputs["w_qkv"]))
    return {"qkv": out["D"]}

