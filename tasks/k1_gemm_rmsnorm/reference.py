from tasks import common

EPS = 1e-6


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    x = common.normal((M, d), gen, device)
    nw = common.norm_weight(d, gen, device)
    return {
        "h": (x.float() * nw.float()).bfloat16(),
        "rstd": common.rstd_of(x, EPS),
        "w": common.linear_weight(3 * d, d, gen, device),
    }


def reference(inputs, dims):
    return {"out": inputs["rstd"][:, None] * (inputs["h"] @ inputs["w"].T)}
