from tasks import common


def make_inputs(dims, gen, device):
    M, d = dims["M"], dims["d"]
    h, rstd = common.deferred_rmsnorm_input(M, d, gen, device)
    return {
        "h": h,
        "rstd": rstd,
        "w": common.linear_weight(3 * d, d, gen, device),
    }


def reference(inputs, dims):
    return {"out": inputs["rstd"][:, None] * (inputs["h"] @ inputs["w"].T)}
