"""k1 with annotations that are evaluated (no `from __future__ import annotations`):
`import typing` names inside annotations, a string annotation, an annotated local."""

import typing

import torch

import primitives as P

TASK = "k1_gemm_rmsnorm"
AUTHOR = "tests: honest kernels"


@P.epilogue(operands={"rstd": P.PerRow()})
def row_scale(acc, rstd):
    return {"D": rstd * acc}


def run(inputs: typing.Dict[str, torch.Tensor], prepared: typing.Mapping[str, typing.Any],
        config: "P.GemmConfig | None" = None) -> typing.Dict[str, torch.Tensor]:
    outputs: typing.Dict[str, torch.Tensor] = {}
    outputs["out"] = row_scale(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config)["D"]
    return outputs
