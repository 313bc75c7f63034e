"""Baselines timed beside each fused kernel: the GEMM alone (cuBLAS, and quack's own
mainloop with an identity epilogue: the speed of light for a fused kernel)."""

from __future__ import annotations

import primitives as P


@P.epilogue()
def gemm_only(acc):
    """quack's GEMM with nothing fused: D = acc."""
    return {"D": acc}
