"""k5: row scale by rstd, then the online log-sum-exp and the target logit of each row;
the logits are never stored (store_d=False)."""

import primitives as P

TASK = "k5_gemm_rmsnorm_partial_cross_entropy"
AUTHOR = "epiforge maintainers"


@P.epilogue(
    operands={"rstd": P.PerRow()},
    reductions={"lse": P.RowLogSumExp(), "target_logit": P.RowSelect(index="targets")},
)
def rmsnorm_cross_entropy(acc, rstd):
    logits = acc * rstd
    return {"lse": logits, "target_logit": logits}


def run(inputs, prepared, config=None):
    out = rmsnorm_cross_entropy(
        inputs["h"], inputs["w_lm"], rstd=inputs["rstd"], targets=inputs["targets"], store_d=False, config=config
    )
    loss, lse = P.finish.cross_entropy(out["lse"], out["target_logit"])
    return {"loss": loss, "lse": lse}
