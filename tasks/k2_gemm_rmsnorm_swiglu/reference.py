from tasks import common

EPS = 1e-6


def make_inputs(dims, gen, device):
    M, d, F = dims["M"], dims["d"], dims["F"]
    x = common.normal((M, d), gen, device)
    nw = common.norm_weight(d, gen, device)
    return {
        "h": (x.float() * nw.float()).bfloat16(),
        "rstd": common.rstd_of(x, EPS),
        "w_gu": common.linear_weight(2 * F, d, gen, device),
    }


def reference(inputs, dims):
    z = inputs["rstd"][:, None] * (inputs["h"] @ inputs["w_gu"].T)
    return {"z": z, "out": common.swiglu_interleaved(z)}
