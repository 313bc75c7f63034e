"""k3d: k3's rotation with the pre-RoPE projection stored too, as CODA v0.1's kernel_3 does:
D is the raw accumulator (qkv_pre), and the rotated pairs (P.rope_rotate on the frequency
table, -inv_freq for CODA's -angle; zero for V columns, an exact identity) go to a pair
output stored at full width beside it."""

import primitives as P

TASK = "k3d_gemm_rope_store_d"
AUTHOR = "epiforge maintainers"
ROPE_DIRECTION = -1  # the task's scalar rope_direction (CODA v0.1)

# not tuned for this task yet: k3's measured best configs (the same GEMM and rotation, plus
# a second full-tile store), bench/results/h200 via human_kernels/k3_gemm_rope.py
TUNED = {
    "16384x6144x2048": "128x192_c1x2_pp",
    "16384x12288x4096": "128x192_c2x1_pp",
    "16384x24576x8192": "128x128_c1x2_pp",
}


@P.epilogue(pair_outputs=("rotated",), operands={"pos": P.PerRow(), "freq": P.PerCol()}, mode="acc_pair")
def qkv_rope_store_d(acc, pos, freq):
    x, y = P.unpack(acc)
    return {"rotated": P.pack(*P.rope_rotate(x, y, pos, freq))}  # no "D": D is the accumulator


def prepare(consts):
    # w_qkv is (3d, d): q and k rotate (by -pos * inv_freq: the task's rope_direction), v passes through
    return {"freq": P.prepare.qkv_rope_freq_table(consts["inv_freq"], d=consts["w_qkv"].shape[1], direction=ROPE_DIRECTION)}


def run(inputs, prepared, config=None):
    out = qkv_rope_store_d(inputs["a"], inputs["w_qkv"], pos=inputs["positions"], freq=prepared["freq"],
                           config=config or P.pick_config(TUNED, inputs["a"], inputs["w_qkv"]))
    return {"qkv": out["rotated"], "qkv_pre": out["D"]}
