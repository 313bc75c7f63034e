"""The fused kernels as PyTorch ops for training code: a fused LLaMA-3 layer.

    ops.py    torch.library custom ops with autograd and fake (meta) implementations, so
              they run in eager mode and under torch.compile(fullgraph=True). Each op calls
              the expert kernels (human_kernels/): on a Hopper GPU the fused CuTe-DSL GEMMs,
              on a CPU the emulator, so a model built from them is testable in CI.
              swiglu_mlp (k8 / k7), rmsnorm_qkv_rope (k4hf / torch RoPE^-1 + k6),
              attention_out_mlp (k0, k2 / k7 -> k6), rmsnorm_qk_norm_rope (Qwen3: qkn /
              torch QK-norm backward + k6).
    layer.py  LlamaLayerConfig; FusedLlamaLayer (the decoder layer from those ops and torch's
              causal GQA attention); ReferenceLlamaLayer (the same parameters, unfused torch,
              float32); the Hugging Face weight layout converted at load time.
    model_ops.py  the ops of a stack of layers, cut so the block re-cut crosses layer
              boundaries: embed_rmsnorm_qkv_rope (gather, torch norm, k4hf), decoder_block
              (k0, k2, k0 with the next layer's norm, k4hf / RoPE^-1, k6, k7, k6; with
              Qwen3's QK-norm qkn instead of k4hf, its backward in torch),
              decoder_block_loss (k0, k2, k0 with the final norm, k5 / the logits again with
              the CE backward in their epilogue, k6, k7, k6; with store_logits k5l / one
              compiled pass over the stored logits instead of that GEMM),
              decoder_block_logits (k0, k2, k0 with the final norm, k1: the logits, no loss /
              k6, k7, k6).
    model.py  LlamaModelConfig; FusedLlamaModel (embedding, N layers, final norm, LM head and
              mean cross-entropy from those ops); ReferenceLlamaModel (unfused, float32);
              HF LlamaForCausalLM state dicts (model.embed_tokens, model.layers.N.*,
              model.norm, lm_head).
    loss_curve.py  trains the fused and the reference model side by side on a synthetic
              Markov-chain token stream (and the reference holding bf16-rounded weights, to
              split the gap); writes the loss curves (JSON) and a plot into --out.
"""
