"""k9 with quack's library epilogue, imported by name, and the finishing step through an
imported submodule."""

from primitives import finish, from_quack, pick_config

TASK = "k9_gemm_partial_cross_entropy"
AUTHOR = "tests: honest kernels"

TUNED = {"16384x32768x2048": "128x192_c2x1_pp"}

lm_head_cross_entropy = from_quack("quack.epilogue.library:lse_target_epi")


def run(inputs, prepared, config=None):
    a, w_lm = inputs["a"], inputs["w_lm"]
    out = lm_head_cross_entropy(a, w_lm, target=inputs["targets"], store_d=False, config=config or pick_config(TUNED, a, w_lm))
    loss, lse = finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}
