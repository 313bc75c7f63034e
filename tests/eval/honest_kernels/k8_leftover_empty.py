"""k8 with a leftover from development: run() allocates a scratch buffer with torch.empty
that it no longer uses. An allocation runs no kernel on the GPU; the CPU's launch check must
agree (torch records an aten::detach after the factory call while the kernel is described)."""

import torch

import primitives as P

TASK = "k8_gemm_swiglu"
AUTHOR = "tests: honest kernels"

gate_up_swiglu = P.from_quack("quack.epilogue.library:swiglu_mod")


def run(inputs, prepared, config=None):
    a = inputs["a"]
    scratch = torch.empty(a.shape[0], 2 * a.shape[1], dtype=torch.float32, device=a.device)  # noqa: F841 - unused
    out = gate_up_swiglu(a, inputs["w_gu"], config=config)
    return {"z": out["D"], "out": out["postact"]}
