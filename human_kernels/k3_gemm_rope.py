"""k3: RoPE in the QKV projection's epilogue with quack's rope_posfreq_epi: the angle
pos * inv_freq is computed in-kernel in float-float turns from a per-column frequency
table (zero for V columns, an exact identity)."""

import primitives as P

TASK = "k3_gemm_rope"
AUTHOR = "quack library (CODA's authors)"

qkv_rope = P.from_quack("quack.epilogue.rotary:rope_posfreq_epi")


def prepare(consts):
    d = consts["w_qkv"].shape[1]
    head_dim = 2 * consts["inv_freq"].shape[0]
    return {"freq": P.prepare.rope_freq_table(consts["inv_freq"], head_dim, rotary_cols=2 * d, passthrough_cols=d)}


def run(inputs, prepared, config=None):
    out = qkv_rope(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"], config=config)
    return {"qkv": out["D"]}
