"""A LLaMA-3 causal language model whose non-attention parts run as GEMM-epilogue programs
forward and backward (training/model_ops.py), and an unfused float32 reference with the same
parameters; Hugging Face LlamaForCausalLM weights load into both.

    tokens -> embed_rmsnorm_qkv_rope        (gather, layer 0's norm in torch, k4hf; qkn with QK-norm)
           -> attention -> decoder_block    (k0, k2, k0 + layer 1's norm, layer 1's k4hf)
           -> ...          (N-1 of them)
           -> attention -> decoder_block_loss (k0, k2, k0 + final norm, k5; k5l with
                                                 store_logits)  -> mean loss (ignore_index rows left out)

Parameters: embed (V, d); layers.N.* (training/layer.py's, in the kernels' layout);
final_norm (d,); lm_head (V, d). The HF names are model.embed_tokens.weight,
model.layers.N.<HF layer names>, model.norm.weight and lm_head.weight; a checkpoint with tied
embeddings (no lm_head.weight, e.g. LLaMA-3.2-1B) loads the embedding into lm_head, untied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from epiforge.training.layer import (
    FusedLlamaLayer,
    LlamaLayerConfig,
    ReferenceLlamaLayer,
    check_hf_entries,
    hf_layer_shapes,
    hf_to_kernel_layout,
    require_bfloat16,
)
from epiforge.training.model_ops import decoder_block, decoder_block_logits, decoder_block_loss, embed_rmsnorm_qkv_rope


@dataclass(frozen=True)
class LlamaModelConfig:
    """The model's sizes: the vocabulary (a multiple of 8: the GPU's TMA moves 16-byte rows
    of the LM-head weight; LLaMA-3's 128256 is one), the number of layers, one layer's sizes."""

    vocab: int
    n_layers: int
    layer: LlamaLayerConfig

    def __post_init__(self):
        if self.n_layers < 1 or self.vocab < 8 or self.vocab % 8:
            raise ValueError(f"{self}: need at least one layer and a vocabulary a multiple of 8")


class _ModelParams(torch.nn.Module):
    """The parameters both models hold; layer_type gives the layers (their parameters and
    attention; FusedLlamaModel does not call their forward)."""

    def __init__(self, cfg: LlamaModelConfig, layer_type, dtype: torch.dtype, device=None, layer_args=()):
        super().__init__()
        self.cfg = cfg
        d = cfg.layer.d
        self.embed = torch.nn.Parameter(torch.randn(cfg.vocab, d).to(device=device, dtype=dtype))
        self.layers = torch.nn.ModuleList(layer_type(cfg.layer, *layer_args, device=device) for _ in range(cfg.n_layers))
        self.final_norm = torch.nn.Parameter(torch.ones(d, device=device, dtype=dtype))
        self.lm_head = torch.nn.Parameter((torch.randn(cfg.vocab, d) / d**0.5).to(device=device, dtype=dtype))

    def _batch_seq(self, tokens: torch.Tensor, targets: torch.Tensor | None) -> tuple[int, int]:
        """tokens' (batch, seq), or one clear error where tokens and targets (if given) are not
        integer (batch, seq) tensors of one shape."""
        name = type(self).__name__
        for what, t in (("tokens", tokens), ("targets", targets)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 2 or t.is_floating_point()
                                  or t.is_complex()):
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: {what} must be integer (batch, seq), got {got}")
        if targets is not None and targets.shape != tokens.shape:
            raise ValueError(f"{name}: targets {tuple(targets.shape)} must have the tokens' shape {tuple(tokens.shape)}")
        # a negative id would index the embedding from its end (nn.Embedding refuses it too);
        # asynchronous, as the targets' check: no host sync
        torch._assert_async(((tokens >= 0) & (tokens < self.cfg.vocab)).all(),
                            f"tokens must lie in [0, {self.cfg.vocab})")
        return tokens.shape[0], tokens.shape[1]

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor], tie_word_embeddings: bool | None = None) -> None:
        """Copy a LlamaForCausalLM state dict in (HF names and layout; converted once). All of
        it is checked first, every layer's names and shapes included: a missing, unexpected or
        wrongly shaped entry is one ValueError naming it, and the model is left as it was; then
        the layers are converted and copied one at a time (no second converted copy of the
        whole model). tie_word_embeddings (HF config's name): True, the LM head is the
        embedding (a lm_head.weight in the state dict must equal it); False, the state dict
        must hold its own lm_head.weight; None, as the state dict says (tied where it has none)."""
        n, c = self.cfg.n_layers, self.cfg.layer
        layer_keys = {k for k in sd if k.startswith("model.layers.")}
        extra = {k.split(".")[2] for k in layer_keys} - {str(i) for i in range(n)}
        if extra:
            raise ValueError(f"the state dict does not fit: layers {sorted(extra)} beyond this model's {n}")
        tied = "lm_head.weight" not in sd if tie_word_embeddings is None else tie_word_embeddings
        top = {"model.embed_tokens.weight": (self.cfg.vocab, c.d), "model.norm.weight": (c.d,)}
        if not tied:
            top["lm_head.weight"] = (self.cfg.vocab, c.d)
        if tied and "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
            raise ValueError("the state dict does not fit: lm_head.weight differs from model.embed_tokens.weight, "
                             "which tie_word_embeddings=True makes the LM head")
        check_hf_entries({k: v for k, v in sd.items() if k not in layer_keys and not (tied and k == "lm_head.weight")},
                         top)
        prefixes = [f"model.layers.{i}." for i in range(n)]
        per_layer = [{k[len(p):]: v for k, v in sd.items() if k.startswith(p)} for p in prefixes]
        for p, layer_sd in zip(prefixes, per_layer):
            check_hf_entries(layer_sd, hf_layer_shapes(c), p)
        with torch.no_grad():
            self.embed.copy_(sd["model.embed_tokens.weight"])
            self.final_norm.copy_(sd["model.norm.weight"])
            self.lm_head.copy_(sd["model.embed_tokens.weight"] if tied else sd["lm_head.weight"])
        for layer, p, layer_sd in zip(self.layers, prefixes, per_layer):
            layer.copy_params(hf_to_kernel_layout(layer_sd, c, p))

    def to_hf_state_dict(self) -> dict[str, torch.Tensor]:
        sd = {"model.embed_tokens.weight": self.embed.detach(), "model.norm.weight": self.final_norm.detach(),
              "lm_head.weight": self.lm_head.detach()}
        for i, layer in enumerate(self.layers):
            sd.update({f"model.layers.{i}.{k}": v for k, v in layer.to_hf_state_dict().items()})
        return sd


class FusedLlamaModel(_ModelParams):
    """The model through the fused ops; bfloat16 parameters and activations (no autocast: the
    parameters themselves are bf16, and so is an optimizer's state kept beside them).
    forward(tokens (B, S) int64, targets (B, S) int64, positions (S,) or (B, S) | None) ->
    the mean cross-entropy over the rows whose target is not ignore_index (float32; NaN when
    every row is ignored, as F.cross_entropy gives, with zero gradients). ignore_index (an
    attribute, -100 as in torch and Hugging Face) marks padding: such a row's loss and
    gradient are zero. Any other target, or a token, outside [0, vocab) is an error, raised by
    an asynchronous assert (no host sync; on a GPU a device-side assert, as F.cross_entropy's).
    forward(tokens) without targets -> the logits (B, S, V) bf16, differentiable (k1 for the
    LM head: evaluation, generation, a loss of one's own). Positions only turn RoPE's angles:
    sequences packed into one row still attend to each other (no document mask). The model
    runs its layers' parameters through its own block ops, not the layers' forward, so hooks
    on layers[i] do not fire. With qk_norm (Qwen3) every layer's
    QKV GEMM is qkn on the normalised input (made in torch from k0's x and rstd) instead of
    k4hf, its QK-norm backward in torch; the rest is the same.

    store_logits (an attribute, settable between steps; on by default): the LM head is k5l,
    which keeps the bf16 logits (M x V x 2 bytes, 4.2 GB at LLaMA-3's vocabulary and 16384
    tokens) for the backward, which overwrites them with dlogits; off, it is k5, whose backward
    recomputes them with a second LM-head GEMM (less memory, one more GEMM). At the 1B step on
    an H100 the stored logits were faster and peaked below torch.compile's step
    (lab/results/h100/training/step-5.json). Since the backward writes dlogits over them, a
    second backward through the same graph (retain_graph=True) fails with an in-place error;
    with store_logits off it works.

    keep_act (an attribute, settable between steps; off by default): every layer keeps
    SwiGLU's forward output for the backward (M x F bf16 per layer: 4 GiB at the 1B step's 16
    layers and 16384 tokens), so each backward's down-projection dgrad stores no second copy
    (training/ops.py kept_act)."""

    def __init__(self, cfg: LlamaModelConfig, device=None, store_logits: bool = True, ignore_index: int = -100,
                 keep_act: bool = False):
        if cfg.layer.fused_kernel_problems():
            raise ValueError(f"FusedLlamaModel: {'; '.join(cfg.layer.fused_kernel_problems())} ({cfg.layer})")
        super().__init__(cfg, FusedLlamaLayer, torch.bfloat16, device)
        self.store_logits = store_logits
        self.ignore_index = ignore_index
        self.keep_act = keep_act

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        c = self.cfg.layer
        require_bfloat16(self)
        batch, seq = self._batch_seq(tokens, targets)
        first, last = self.layers[0], self.layers[-1]
        pos = first._positions(batch, seq, positions, tokens.device)
        rope = (pos, first.inv_freq, c.q_cols + c.kv_cols)
        qkv, x, _ = embed_rmsnorm_qkv_rope(tokens.reshape(-1), self.embed, first.input_norm, first.w_qkv, *rope, c.eps,
                                           *first.qk_norms())
        for layer, nxt in zip(self.layers[:-1], self.layers[1:]):
            attn = layer._attention(qkv, batch, seq)
            qkv, x, *_ = decoder_block(attn, x, layer.w_o, layer.post_norm, layer.w_gu, layer.w_down,
                                       nxt.input_norm, nxt.w_qkv, *rope, c.eps, *nxt.qk_norms(), self.keep_act)
        attn = last._attention(qkv, batch, seq)
        if targets is None:
            return decoder_block_logits(attn, x, last.w_o, last.post_norm, last.w_gu, last.w_down, self.final_norm,
                                        self.lm_head, c.eps, self.keep_act)[0].reshape(batch, seq, -1)
        flat = targets.reshape(-1)
        kept = flat != self.ignore_index
        torch._assert_async(((flat >= 0) & (flat < self.cfg.vocab) | ~kept).all(),
                            f"targets must lie in [0, {self.cfg.vocab}) or be ignore_index ({self.ignore_index})")
        # an ignored row's loss is taken at target 0 and weighted 0: its dloss, so its dlogits, is 0
        loss = decoder_block_loss(attn, x, last.w_o, last.post_norm, last.w_gu, last.w_down, self.final_norm,
                                  self.lm_head, torch.where(kept, flat, 0), c.eps, self.store_logits,
                                  self.keep_act)[0]
        # the mean over the kept rows; none kept: NaN as F.cross_entropy gives, with zero
        # gradients as its backward gives (0 / 0 would send NaN into every parameter)
        n = kept.sum()
        mean = (loss * kept).sum() / n.clamp(min=1)
        return torch.where(n > 0, mean, torch.full_like(mean, float("nan")))


class ReferenceLlamaModel(_ModelParams):
    """The same model, same parameters and layout, as plain unfused torch in float32 (or
    bfloat16: the plain low-precision pipeline, with the logits upcast to float32 for the
    loss as Hugging Face's loss does)."""

    def __init__(self, cfg: LlamaModelConfig, dtype: torch.dtype = torch.float32, device=None, ignore_index: int = -100):
        super().__init__(cfg, ReferenceLlamaLayer, dtype, device, layer_args=(dtype,))
        self.ignore_index = ignore_index

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """The mean cross-entropy, or without targets the logits (B, S, V) in the model's dtype."""
        self._batch_seq(tokens, targets)
        x = self.embed[tokens]
        for layer in self.layers:
            x = layer(x, positions)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.layer.eps) * self.final_norm
        logits = x @ self.lm_head.T
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, self.cfg.vocab), targets.reshape(-1),
                               ignore_index=self.ignore_index)
