"""k1 with postponed type hints: typing names appear only in annotations, a local named
like a builtin (`input`), `from primitives import ...`, a TUNED table and pick_config."""

from __future__ import annotations

from typing import Any, Optional

import torch

from primitives import PerRow, epilogue, pick_config

TASK = "k1_gemm_rmsnorm"
AUTHOR = "tests: honest kernels"

TUNED: dict[str, str] = {
    "16384x6144x2048": "128x128_c1x2_pp",
    "16384x12288x4096": "128x128_c1x2_pp",
}


@epilogue(operands={"rstd": PerRow()})
def row_scale(acc: Any, rstd: Any) -> dict[str, Any]:
    """The deferred RMSNorm's row scale."""
    return {"D": acc * rstd}


def run(inputs: dict[str, torch.Tensor], prepared: dict, config: Optional["GemmConfig"] = None) -> dict[str, torch.Tensor]:
    input = inputs["h"]  # a local may reuse a builtin's name
    weight: torch.Tensor = inputs["w"]
    out = row_scale(input, weight, rstd=inputs["rstd"], config=config or pick_config(TUNED, input, weight))
    return {"out": out["D"]}
