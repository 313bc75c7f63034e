"""The fused kernels as PyTorch ops for training code (issue 15: a fused LLaMA-3 layer).

    ops.py    torch.library custom ops with autograd and fake (meta) implementations, so
              they run in eager mode and under torch.compile(fullgraph=True). Each op calls
              the expert kernels (human_kernels/): on a Hopper GPU the fused CuTe-DSL GEMMs,
              on a CPU the emulator, so a model built from them is testable in CI.
              swiglu_mlp (k8 / k7), rmsnorm_qkv_rope (k4hf / torch RoPE^-1 + k6),
              attention_out_mlp (k0, k2 / k7 -> k6).
    layer.py  LlamaLayerConfig; FusedLlamaLayer (the decoder layer from those ops and torch's
              causal GQA attention); ReferenceLlamaLayer (the same parameters, unfused torch,
              float32); the Hugging Face weight layout converted at load time.
"""
