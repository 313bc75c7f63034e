from tasks import common

EPS = 1e-6


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    x = common.normal((M, d), gen, device)
    nw = common.norm_weight(d, gen, device)
    return {
        "h": (x.float() * nw.float()).bfloat16(),
        "rstd": common.rstd_of(x, EPS),
        "w_qkv": common.linear_weight(3 * d, d, gen, device),
        "positions": common.positions(M, dims["seq"], device),
        "inv_freq": common.rope_inv_freq(dims["head_dim"], device),
    }


def reference(inputs, dims):
    z = inputs["rstd"][:, None] * (inputs["h"] @ inputs["w_qkv"].T)
    return {"qkv": common.rope_interleaved(z, inputs["positions"], inputs["inv_freq"], 2 * dims["d"])}
