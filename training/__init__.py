"""The fused kernels as PyTorch ops for training code (issue: a fused LLaMA-3 layer).

    ops.py    torch.library custom ops with autograd and fake (meta) implementations, so
              they run in eager mode and under torch.compile(fullgraph=True). Each op calls
              the expert kernels (human_kernels/): on a Hopper GPU the fused CuTe-DSL GEMMs,
              on a CPU the emulator, so a model built from them is testable in CI.

So far: the SwiGLU MLP (k8 forward, k7 backward).
"""
