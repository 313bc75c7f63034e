"""k3: fused QKV GEMM + RoPE on q and k, with quack's rope_posfreq_epi (acc_pair mode).
quack rotates by +angle (Hugging Face's direction); this task follows CODA v0.1's -angle
(rope_direction = -1), so the frequency table holds -inv_freq. The table gives v's columns
frequency 0, an exact identity, so v passes through as the raw accumulator rounded once."""

import primitives as P

TASK = "k3_gemm_rope"
SESSION = "20261207T214644Z-k3-58da3a"
BACKEND = "command"
MODEL = "claude-subagent (an LLM helper session of the developing agent; model version not exposed to it; driven through --backend command: each turn ends when it touches DONE)"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# no GPU measurements made in this session: empty table -> P.DEFAULT_CONFIG
TUNED = {
}

qkv_rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")


def prepare(consts):
    # w_qkv is (3d, d) = [q; k; v]: q and k rotate by -pos * inv_freq, v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1],
                                                  direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    a, w = inputs["a"], inputs["w_qkv"]
    out = qkv_rope(a, w, pos=inputs["positions"], freq=prepared["freq"],
                   config=config or P.pick_config(TUNED, a, w))
    return {"qkv": out["D"]}

