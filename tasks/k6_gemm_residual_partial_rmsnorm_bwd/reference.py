import torch

from epiforge.tasks import common

EPS = 1e-6


def make_inputs(dims, gen, device, dtype=torch.bfloat16):
    M, d, F = dims["M"], dims["d"], dims["F"]
    x = common.normal((M, d), gen, device, dtype=dtype)
    nw = common.norm_weight(d, gen, device, dtype=dtype)
    rstd = common.rstd_of(x, EPS)
    w_gu = common.linear_weight(2 * F, d, gen, device, dtype=dtype)
    dz = common.normal((M, 2 * F), gen, device, std=1e-2, dtype=dtype)
    # a consistent zdz: sum_k z_k dz_k with z = (xhat * w) @ w_gu^T, as k7 would give it
    h = x.float() * rstd[:, None] * nw.float()
    zdz = ((h @ w_gu.float().T) * dz.float()).sum(-1)
    return {
        "dz": dz,
        "w_gu": w_gu,
        "x": x,
        "rstd": rstd,
        "norm_weight": nw,
        "dx_in": common.normal((M, d), gen, device, std=1e-2, dtype=dtype),
        "zdz": zdz,
    }


def reference(inputs, dims, mm=torch.matmul):
    d = dims["d"]
    g = mm(inputs["dz"], inputs["w_gu"])
    rstd = inputs["rstd"][:, None]
    xhat = inputs["x"] * rstd
    w = inputs["norm_weight"]
    dx = inputs["dx_in"] + rstd * (w * g - xhat * (inputs["zdz"][:, None] / d))
    return {"dx": dx, "h": xhat * w, "dw": (g * xhat).sum(0)}
