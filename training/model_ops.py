"""The custom ops of a stack of fused decoder layers (training/model.py), where the block
re-cut of ../shared/notes/coda-workloads.md crosses the layer boundary: one layer's down
projection + residual is k0 with the NEXT layer's input-norm weight, so it writes the next
layer's h = x * w and rstd, and the next QKV GEMM (k4hf) consumes them. Cut at torch's
attention, a model of N layers is

    embed_rmsnorm_qkv_rope   embedding gather, layer 0's input norm (torch: the only norm
                             left in torch), k4hf
    attention ... decoder_block (N-1 times): layer i's k0 (O-proj + residual + post norm),
                             k2 (gate/up + SwiGLU), k0 (down-proj + residual + layer i+1's
                             input norm), layer i+1's k4hf (QKV + row scale + RoPE)
    attention ... decoder_block_loss: the last layer's k0, k2, k0 with the final norm's
                             weight, then the LM head + row scale + cross-entropy one of two
                             ways: k5 (no logits stored; backward: the logits recomputed with
                             the softmax gradient in the same GEMM's epilogue), or with
                             store_logits k5l (the bf16 logits stored, M x V x 2 bytes kept
                             until the backward; backward: one compiled elementwise pass over
                             them instead of the GEMM)
    attention ... decoder_block_logits: the same up to the final norm, then the LM head as k1
                             (GEMM + row scale): the logits themselves, for a model called
                             without targets (backward: their ZdZ, k6, then k7 -> k6)

Why these boundaries (autograd correctness): every RMSNorm backward is k6, which needs the
ZdZ row sums of the GEMM after the norm (k7's for the post-attention norm, the RoPE
backward's for an input norm, the LM head's for the final norm) and, as its accumulate
input, the residual stream's gradient from everywhere else. Each op holds the norm and the
GEMM after it, so the ZdZ passes inside one autograd node; and each op returns the residual
stream it made (x) as a differentiable output that only the next op reads (as its residual),
so x's cotangent, arriving at this op's backward, is exactly the residual gradient k6 adds.
h and rstd never leave an op: the op consuming them is the op producing them.

The residual stream x handed from op to op is the tensor k0 wrote (no copy); z, rstd and the
other saved tensors are non-differentiable outputs (custom ops save only inputs and outputs).

Qwen3 (QK-norm): the entry op and decoder_block take q_norm and k_norm (optional, trailing);
with them the QKV GEMM is qkn (per-head RMSNorm + RoPE in the epilogue) on the normalised
input, which torch makes from x and rstd (qkn cannot take the deferred row scale: its head
statistic's eps breaks the scale invariance), and the QK-norm backward is torch
(training/ops.py qk_norm_rope_grads) before the same k6.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch

from epiforge.training.ops import (
    K6,
    _glue,
    _kernel,
    _row_rstd,
    attention_out_mlp_grads,
    attention_out_swiglu_kernels,
    kept_act,
    kept_act_fake,
    no_zero_grads,
    normalised,
    qk_norm_rope_grads,
    qk_norm_rope_kernel,
    qkv_rope_grads,
    qkv_rope_kernel,
    residual_rmsnorm_kernel,
)

K5 = "k5_gemm_rmsnorm_partial_cross_entropy"
K5L = "k5l_gemm_rmsnorm_cross_entropy_store_logits"


def _bf16(name: str, *tensors: torch.Tensor) -> None:
    if not all(t.dtype == torch.bfloat16 for t in tensors):
        raise ValueError(f"{name}: the expert kernels take bfloat16 operands")


def _check_block(name, attn, residual, w_o, post_norm, w_gu, w_down):
    m, d = residual.shape
    two_f = w_gu.shape[0]
    if attn.shape[0] != m or tuple(w_o.shape) != (d, attn.shape[1]) or tuple(post_norm.shape) != (d,) \
            or w_gu.shape[1] != d or two_f % 2 or tuple(w_down.shape) != (d, two_f // 2):
        raise ValueError(f"{name}: attn {tuple(attn.shape)}, residual {tuple(residual.shape)}, w_o {tuple(w_o.shape)}, "
                         f"post_norm {tuple(post_norm.shape)}, w_gu {tuple(w_gu.shape)}, w_down "
                         f"{tuple(w_down.shape)} do not fit (want (M, n), (M, d), (d, n), (d,), (2F, d), (d, F))")
    _bf16(name, attn, residual, w_o, post_norm, w_gu, w_down)


def _check_qkv(name, m, d, norm_weight, w_qkv, positions, inv_freq, rotary_cols, q_norm=None, k_norm=None):
    head_dim = 2 * inv_freq.shape[0]
    qk_norms = [t for t in (q_norm, k_norm) if t is not None]
    if tuple(norm_weight.shape) != (d,) or w_qkv.shape[1] != d or rotary_cols % head_dim \
            or not 0 < rotary_cols < w_qkv.shape[0] or tuple(positions.shape) != (m,) \
            or len(qk_norms) == 1 or any(tuple(t.shape) != (head_dim,) for t in qk_norms):
        raise ValueError(f"{name}: norm_weight {tuple(norm_weight.shape)}, w_qkv {tuple(w_qkv.shape)}, positions "
                         f"{tuple(positions.shape)}, rotary_cols {rotary_cols}, q_norm/k_norm "
                         f"{[tuple(t.shape) if t is not None else None for t in (q_norm, k_norm)]} do not fit rows "
                         f"({m}, {d}) (q_norm and k_norm both or neither)")
    _bf16(name, norm_weight, w_qkv, *qk_norms)


def _attention_input(x, h, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols, q_norm, k_norm):
    """The QKV GEMM on a deferred RMSNorm: k4hf on h and rstd, or with QK-norm (Qwen3) qkn on
    the normalised x (its head statistic is not invariant to a deferred row scale, because of
    its eps; h goes unused)."""
    if q_norm is None:
        return qkv_rope_kernel(h, rstd, w_qkv, positions, inv_freq, rotary_cols)
    return qk_norm_rope_kernel(normalised(x, rstd, norm_weight), w_qkv, q_norm, k_norm, positions, inv_freq,
                               rotary_cols)


def _attention_input_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols, dx_in, q_norm,
                           k_norm):
    """-> (dx, dnorm_weight, dw_qkv, dq_norm, dk_norm); without QK-norm the last two are
    empty tensors (a custom op returns tensors, not None)."""
    if q_norm is None:
        return (*qkv_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols, dx_in),
                norm_weight.new_empty(0), norm_weight.new_empty(0))
    return qk_norm_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols,
                              dx_in)


def _qk_norm_grads_fake(norm_weight, q_norm, k_norm):
    return tuple(norm_weight.new_empty(0) if t is None else torch.empty_like(t) for t in (q_norm, k_norm))


# ---- the model's entry: embedding -> layer 0's RMSNorm -> QKV -> RoPE ------------------------


@torch.library.custom_op("epiforge::embed_rmsnorm_qkv_rope", mutates_args=())
def embed_rmsnorm_qkv_rope(tokens: torch.Tensor, embed: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor,
                           positions: torch.Tensor, inv_freq: torch.Tensor, rotary_cols: int, eps: float,
                           q_norm: Optional[torch.Tensor] = None, k_norm: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (qkv, x, rstd): x = embed[tokens] (M, d), the residual stream entering layer 0;
    qkv = RoPE(RMSNorm(x) @ w_qkv^T) on the first rotary_cols columns; rstd saved. With
    q_norm and k_norm (Qwen3): the QK-norm before RoPE, qkn instead of k4hf, its backward in
    torch (training/ops.py rmsnorm_qk_norm_rope).
      forward   the gather and layer 0's h = x * w and rstd in torch (no GEMM before it to
                fuse them into), then k4hf.
      backward  RoPE backward and ZdZ in torch, k6 with x's cotangent (the residual
                gradient from decoder_block) as its accumulate input, then the embedding
                gradient as a float32 index_add over the rows (torch)."""
    m = tokens.shape[0]
    if tokens.ndim != 1 or tokens.dtype != torch.int64 or embed.ndim != 2:
        raise ValueError(f"embed_rmsnorm_qkv_rope: tokens {tuple(tokens.shape)} {tokens.dtype} and embed "
                         f"{tuple(embed.shape)} do not fit (want (M,) int64 and (V, d))")
    _check_qkv("embed_rmsnorm_qkv_rope", m, embed.shape[1], norm_weight, w_qkv, positions, inv_freq, rotary_cols,
               q_norm, k_norm)
    _bf16("embed_rmsnorm_qkv_rope", embed)
    x = embed[tokens]
    h = (x.float() * norm_weight.float()).to(x.dtype)
    rstd = _row_rstd(x, eps)
    return _attention_input(x, h, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols, q_norm, k_norm), x, rstd


@embed_rmsnorm_qkv_rope.register_fake
def _(tokens, embed, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps, q_norm=None, k_norm=None):
    m = tokens.shape[0]
    return embed.new_empty(m, w_qkv.shape[0]), embed.new_empty(m, embed.shape[1]), embed.new_empty(m, dtype=torch.float32)


@torch.library.custom_op("epiforge::embed_rmsnorm_qkv_rope_backward", mutates_args=())
def embed_rmsnorm_qkv_rope_backward(dqkv: torch.Tensor, dx: torch.Tensor, qkv: torch.Tensor, x: torch.Tensor,
                                    rstd: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor,
                                    norm_weight: torch.Tensor, w_qkv: torch.Tensor, positions: torch.Tensor,
                                    inv_freq: torch.Tensor, rotary_cols: int, q_norm: Optional[torch.Tensor],
                                    k_norm: Optional[torch.Tensor]
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dembed, dnorm_weight, dw_qkv, dq_norm, dk_norm); the last two empty without QK-norm."""
    dx, dnorm, dw_qkv, dq_norm, dk_norm = _attention_input_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions,
                                                                 inv_freq, rotary_cols, dx, q_norm, k_norm)
    dembed = torch.zeros(embed.shape, dtype=torch.float32, device=embed.device).index_add_(0, tokens, dx.float())
    return dembed.to(embed.dtype), dnorm, dw_qkv, dq_norm, dk_norm


@embed_rmsnorm_qkv_rope_backward.register_fake
def _(dqkv, dx, qkv, x, rstd, tokens, embed, norm_weight, w_qkv, positions, inv_freq, rotary_cols, q_norm, k_norm):
    return (torch.empty_like(embed), torch.empty_like(norm_weight), torch.empty_like(w_qkv),
            *_qk_norm_grads_fake(norm_weight, q_norm, k_norm))


def _embed_setup(ctx, inputs, output):
    tokens, embed, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps, q_norm, k_norm = inputs
    qkv, x, rstd = output
    ctx.mark_non_differentiable(rstd)
    no_zero_grads(ctx)
    ctx.rotary_cols = rotary_cols
    ctx.save_for_backward(qkv, x, rstd, tokens, embed, norm_weight, w_qkv, positions, inv_freq, q_norm, k_norm)


def _embed_backward(ctx, dqkv, dx, drstd_unused):
    qkv, x, rstd, tokens, embed, norm_weight, w_qkv, positions, inv_freq, q_norm, k_norm = ctx.saved_tensors
    if dqkv is None and dx is None:
        return (None,) * 10
    dqkv = torch.zeros_like(qkv) if dqkv is None else dqkv
    dx = torch.zeros_like(x) if dx is None else dx.to(x.dtype).contiguous()
    *grads, dq_norm, dk_norm = embed_rmsnorm_qkv_rope_backward(
        dqkv.to(x.dtype).contiguous(), dx, qkv, x, rstd, tokens, embed, norm_weight, w_qkv, positions, inv_freq,
        ctx.rotary_cols, q_norm, k_norm)
    qk_grads = (None, None) if q_norm is None else (dq_norm, dk_norm)
    return None, *grads, None, None, None, None, *qk_grads


embed_rmsnorm_qkv_rope.register_autograd(_embed_backward, setup_context=_embed_setup)


# ---- between two layers' attentions: O-proj ... down-proj + the next layer's QKV ------------


@torch.library.custom_op("epiforge::decoder_block", mutates_args=())
def decoder_block(attn: torch.Tensor, residual: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor,
                  w_gu: torch.Tensor, w_down: torch.Tensor, next_norm: torch.Tensor, next_w_qkv: torch.Tensor,
                  positions: torch.Tensor, inv_freq: torch.Tensor, rotary_cols: int, eps: float,
                  next_q_norm: Optional[torch.Tensor] = None, next_k_norm: Optional[torch.Tensor] = None,
                  keep_act: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor]:
    """Layer i after its attention, then layer i+1 up to its attention -> (qkv, x, x_mid, z,
    rstd_mid, rstd, act): x_mid = attn @ w_o^T + residual; x = x_mid + SwiGLU(RMSNorm(x_mid) @
    w_gu^T) @ w_down^T, the residual stream entering layer i+1; qkv = layer i+1's
    RoPE(RMSNorm(x) @ next_w_qkv^T). qkv and x are differentiable; x_mid, z (interleaved
    gate/up pre-activation), rstd_mid and rstd are saved for the backward, and with keep_act
    act, SwiGLU's output (training/ops.py kept_act; else empty).
      forward   k0 (O-proj + residual + post norm's h, rstd_mid), k2 (gate/up + row scale +
                SwiGLU), k0 again (down-proj + residual + next_norm's h, rstd), k4hf (layer
                i+1's QKV + row scale + RoPE).
      backward  RoPE^-1 and ZdZ (torch), k6 (QKV dgrad + layer i+1's input-norm backward,
                x's cotangent as its accumulate input: the full gradient of x), k7 (down
                dgrad + SwiGLU backward + ZdZ), k6 fed k7's ZdZ (gate/up dgrad + post-norm
                backward + the residual gradient), plain GEMMs for the weight gradients and
                the O-proj dgrad.
    With next_q_norm and next_k_norm (Qwen3): layer i+1's QK-norm, qkn instead of k4hf and
    its backward in torch, as in embed_rmsnorm_qkv_rope."""
    _check_block("decoder_block", attn, residual, w_o, post_norm, w_gu, w_down)
    _check_qkv("decoder_block", *residual.shape, next_norm, next_w_qkv, positions, inv_freq, rotary_cols,
               next_q_norm, next_k_norm)
    x_mid, rstd_mid, act, z = attention_out_swiglu_kernels(attn, residual, w_o, post_norm, w_gu, eps)
    h, x, rstd = residual_rmsnorm_kernel(act, w_down, x_mid, next_norm, eps)
    qkv = _attention_input(x, h, rstd, next_norm, next_w_qkv, positions, inv_freq, rotary_cols, next_q_norm,
                           next_k_norm)
    return qkv, x, x_mid, z, rstd_mid, rstd, kept_act(act, keep_act)


@decoder_block.register_fake
def _(attn, residual, w_o, post_norm, w_gu, w_down, next_norm, next_w_qkv, positions, inv_freq, rotary_cols, eps,
      next_q_norm=None, next_k_norm=None, keep_act=False):
    m = residual.shape[0]
    return (residual.new_empty(m, next_w_qkv.shape[0]), torch.empty_like(residual), torch.empty_like(residual),
            residual.new_empty(m, w_gu.shape[0]), residual.new_empty(m, dtype=torch.float32),
            residual.new_empty(m, dtype=torch.float32), kept_act_fake(residual, w_down, keep_act))


@torch.library.custom_op("epiforge::decoder_block_backward", mutates_args=())
def decoder_block_backward(dqkv: torch.Tensor, dx: torch.Tensor, qkv: torch.Tensor, x: torch.Tensor,
                           rstd: torch.Tensor, attn: torch.Tensor, x_mid: torch.Tensor, z: torch.Tensor,
                           rstd_mid: torch.Tensor, act: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor,
                           w_gu: torch.Tensor,
                           w_down: torch.Tensor, next_norm: torch.Tensor, next_w_qkv: torch.Tensor,
                           positions: torch.Tensor, inv_freq: torch.Tensor, rotary_cols: int,
                           next_q_norm: Optional[torch.Tensor], next_k_norm: Optional[torch.Tensor]
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dattn, dresidual, dw_o, dpost_norm, dw_gu, dw_down, dnext_norm, dnext_w_qkv,
    dnext_q_norm, dnext_k_norm); the last two empty without QK-norm. act: the forward's
    kept SwiGLU output, or empty."""
    dx, dnext_norm, dnext_w_qkv, dq_norm, dk_norm = _attention_input_grads(
        dqkv, qkv, x, rstd, next_norm, next_w_qkv, positions, inv_freq, rotary_cols, dx, next_q_norm, next_k_norm)
    # x = x_mid + down(...): dx is the down projection's output gradient and x_mid's residual one
    return (*attention_out_mlp_grads(dx, dx, attn, w_o, post_norm, w_gu, w_down, x_mid, z, rstd_mid, act),
            dnext_norm, dnext_w_qkv, dq_norm, dk_norm)


@decoder_block_backward.register_fake
def _(dqkv, dx, qkv, x, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, next_norm, next_w_qkv,
      positions, inv_freq, rotary_cols, next_q_norm, next_k_norm):
    return (*(torch.empty_like(t) for t in (attn, x, w_o, post_norm, w_gu, w_down, next_norm, next_w_qkv)),
            *_qk_norm_grads_fake(next_norm, next_q_norm, next_k_norm))


def _block_setup(ctx, inputs, output):
    (attn, residual, w_o, post_norm, w_gu, w_down, next_norm, next_w_qkv, positions, inv_freq, rotary_cols, eps,
     next_q_norm, next_k_norm, keep_act) = inputs
    qkv, x, x_mid, z, rstd_mid, rstd, act = output
    ctx.mark_non_differentiable(x_mid, z, rstd_mid, rstd, act)
    no_zero_grads(ctx)
    ctx.rotary_cols = rotary_cols
    ctx.save_for_backward(qkv, x, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, next_norm,
                          next_w_qkv, positions, inv_freq, next_q_norm, next_k_norm)


def _block_backward(ctx, dqkv, dx, *unused):
    *saved, next_q_norm, next_k_norm = ctx.saved_tensors
    if dqkv is None and dx is None:
        return (None,) * 15
    qkv, x = saved[0], saved[1]
    dqkv = torch.zeros_like(qkv) if dqkv is None else dqkv
    dx = torch.zeros_like(x) if dx is None else dx.to(x.dtype).contiguous()
    *grads, dq_norm, dk_norm = decoder_block_backward(dqkv.to(x.dtype).contiguous(), dx, *saved, ctx.rotary_cols,
                                                      next_q_norm, next_k_norm)
    qk_grads = (None, None) if next_q_norm is None else (dq_norm, dk_norm)
    return (*grads, None, None, None, None, *qk_grads, None)


decoder_block.register_autograd(_block_backward, setup_context=_block_setup)


# ---- the last layer after its attention, the final norm, LM head and loss ------------------


def _last_block_kernels(name, attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, eps):
    """The last layer after its attention up to the final norm, its operands and the LM head's
    checked (one line naming the op): k0, k2, k0 with the final norm's weight -> (x_mid,
    rstd_mid, act, z, h, x, rstd), h and rstd the LM head's input (decoder_block_loss and
    decoder_block_logits)."""
    _check_block(name, attn, residual, w_o, post_norm, w_gu, w_down)
    d = residual.shape[1]
    if tuple(final_norm.shape) != (d,) or w_lm.ndim != 2 or w_lm.shape[1] != d:
        raise ValueError(f"{name}: final_norm {tuple(final_norm.shape)}, w_lm {tuple(w_lm.shape)} do not fit (want "
                         f"({d},), (V, {d}))")
    _bf16(name, final_norm, w_lm)
    x_mid, rstd_mid, act, z = attention_out_swiglu_kernels(attn, residual, w_o, post_norm, w_gu, eps)
    h, x, rstd = residual_rmsnorm_kernel(act, w_down, x_mid, final_norm, eps)
    return x_mid, rstd_mid, act, z, h, x, rstd


@torch.library.custom_op("epiforge::decoder_block_loss", mutates_args=())
def decoder_block_loss(attn: torch.Tensor, residual: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor,
                       w_gu: torch.Tensor, w_down: torch.Tensor, final_norm: torch.Tensor, w_lm: torch.Tensor,
                       targets: torch.Tensor, eps: float, store_logits: bool = False, keep_act: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The last layer after its attention, the final RMSNorm, LM head and cross-entropy ->
    (loss, lse, x_mid, z, rstd_mid, x, h, rstd, logits, act): loss (M,) float32 per row, logits =
    RMSNorm(x) @ w_lm^T with x the last layer's output; only loss is differentiable, the rest
    is saved for the backward (lse: logsumexp of each row's logits; h = x * final_norm;
    logits: (M, V) bf16 with store_logits, else an empty tensor; the backward's workspace:
    an eager backward overwrites them with dlogits, see overwrite_logits_with_dlogits); act:
    SwiGLU's output with keep_act (training/ops.py kept_act), else empty.
      forward   k0, k2, k0 with the final norm's weight (as in decoder_block), then k5 (LM-head
                GEMM + row scale + online log-sum-exp and target logit; the M x V logits never
                reach memory) or, with store_logits, k5l (the same, the bf16 logits stored).
      backward  dlogits = dloss * (exp(logits - lse) - onehot(target)) in bf16 and ZdZ = sum
                logits * dlogits per row (lm_head_loss_grads): without stored logits one GEMM
                recomputes them with the softmax gradient in its epilogue; with them (the bf16
                logits, as torch.compile's own model keeps them) a compiled row reduction (their
                own lse, and ZdZ) and one compiled elementwise pass that writes dlogits over
                them (overwrite_logits_with_dlogits). Then k6 with the LM-head weight in the gate/up weight's place
                (LM-head dgrad + final-norm backward; its accumulate input is zero, the final
                residual stream has no other reader), dw_lm = dlogits^T (xhat * w) from k6's
                recomputed h; then k7 -> k6 as in decoder_block."""
    m = residual.shape[0]
    if tuple(targets.shape) != (m,) or targets.dtype != torch.int64:
        raise ValueError(f"decoder_block_loss: targets {tuple(targets.shape)} {targets.dtype} do not fit (want ({m},) "
                         "int64)")
    x_mid, rstd_mid, act, z, h, x, rstd = _last_block_kernels("decoder_block_loss", attn, residual, w_o, post_norm,
                                                               w_gu, w_down, final_norm, w_lm, eps)
    out = _kernel(K5L if store_logits else K5).run(
        {"h": h, "rstd": rstd, "w_lm": w_lm.contiguous(), "targets": targets.contiguous()}, {})
    logits = out["logits"] if store_logits else h.new_empty(0)
    return out["loss"], out["lse"], x_mid, z, rstd_mid, x, h, rstd, logits, kept_act(act, keep_act)


@decoder_block_loss.register_fake
def _(attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, targets, eps, store_logits=False,
      keep_act=False):
    m = residual.shape[0]

    def rows():
        return residual.new_empty(m, dtype=torch.float32)

    logits = residual.new_empty(m, w_lm.shape[0]) if store_logits else residual.new_empty(0)
    return (rows(), rows(), torch.empty_like(residual), residual.new_empty(m, w_gu.shape[0]), rows(),
            torch.empty_like(residual), torch.empty_like(residual), rows(), logits,
            kept_act_fake(residual, w_down, keep_act))


@lru_cache(maxsize=None)
def lm_head_ce_backward_epilogue():
    """The LM head's logits recomputed, and the cross-entropy's gradient taken from them in
    the same GEMM's epilogue: D = dloss * exp(logits - lse) in bf16 (every column but the
    target's, which lm_head_loss_grads sets), the row sums of logits * D (ZdZ, before the
    target's correction) and the target logit itself. No M x V tensor but D is made."""
    from epiforge import primitives as P

    @P.epilogue(operands={"rstd": P.PerRow(), "lse": P.PerRow(), "dloss": P.PerRow()},
                reductions={"zd": P.RowReduce(product=True), "target_logit": P.RowSelect(index="targets")})
    def lm_head_ce_backward(acc, rstd, lse, dloss):
        logits = acc * rstd
        grad = dloss * P.exp(logits - lse)
        return {"D": grad, "zd": (logits, grad), "target_logit": logits}

    return lm_head_ce_backward


def _cross_entropy_grads_recomputed(dloss, h, rstd, lse, w_lm, targets):
    """(dlogits, ZdZ) with the logits recomputed: one GEMM with the softmax gradient in its
    epilogue (lm_head_ce_backward_epilogue); the target column, one value per row, is then
    set from the exact float32 target logit, dloss * (exp(z_t - lse) - 1), and ZdZ gets its
    -dloss * z_t."""
    from epiforge import primitives as P

    out = lm_head_ce_backward_epilogue()(h, w_lm.contiguous(), rstd=rstd, lse=lse.contiguous(), dloss=dloss,
                                         targets=targets.contiguous(), config=P.pick_config(_kernel(K5).TUNED, h, w_lm))
    dlogits, target_logit = out["D"], out["target_logit"]
    rows = torch.arange(len(targets), device=targets.device)
    dlogits[rows, targets] = (dloss * (torch.exp(target_logit - lse) - 1.0)).to(dlogits.dtype)
    return dlogits, P.finish.row_sum(out["zd"]) - dloss * target_logit


def _cross_entropy_stats_of_stored(logits, lse, dloss, targets):
    """(lse, ZdZ) of the stored bf16 logits, in float32, in one pass over them (a glue
    function): their own log-sum-exp, and ZdZ = sum_v z_v dlogits_v = dloss * (sum_v z_v
    softmax(z)_v - z_target). Their own, not the forward's (k5l's `lse`, of the logits before
    rounding): against that one the rounded logits' softmax does not sum to 1, and a
    confident row's target gradient, p_t - 1 near 0, came out as large as z_t's rounding (up
    to 2^-9 |z_t|: 0.06 at |z| = 32); so did the whole gradient of a batch predicted
    perfectly. From their own it is the cross-entropy gradient of the logits as stored, as the
    plain bf16 pipeline takes it. The forward's lse serves as the shift of the exponentials,
    so both sums read the row once (no row maximum first): s = sum exp(z - lse) gives their
    own lse + log s, and sum z exp(z - lse) / s the softmax-weighted sum. The forward's lse
    lies between the row's largest logit and log V above it, so every term lies between
    exp(-log V - r) and exp(r), r the stored logit's rounding (half a bf16 ulp): safe while
    |z| < 2^15, where r is at most 64 (at 2^15 it is 128, past float32's exp limit of 88)."""
    z = logits.float()
    e = torch.exp(z - lse[:, None])
    s = e.sum(-1)
    return lse + torch.log(s), dloss * ((z * e).sum(-1) / s - z.gather(1, targets[:, None])[:, 0])


def _cross_entropy_grads_into_logits(logits, lse, dloss, targets) -> None:
    """dlogits = dloss * (softmax(z) - onehot(target)) with lse the stored logits' own, in
    float32, rounded once, written over the stored logits (this is their last use): one
    elementwise pass with no M x V tensor made (a glue function), so the backward's peak holds
    one M x V tensor, as the recomputing backward does (whose dlogits come from the GEMM)."""
    z = logits.float()
    hit = torch.arange(z.shape[1], device=z.device)[None, :] == targets[:, None]
    logits.copy_((dloss[:, None] * (torch.exp(z - lse[:, None]) - hit.to(z.dtype))).to(logits.dtype))


def overwrite_logits_with_dlogits(logits, lse, dloss, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """(dlogits, ZdZ) from the bf16 logits k5l stored (lse: k5l's, of the logits before
    rounding): their own log-sum-exp and ZdZ by one row reduction
    (_cross_entropy_stats_of_stored), then dlogits by one elementwise pass written
    over the logits, their last use (so the backward's peak holds one M x V tensor, not two),
    and returned as that same tensor. So after an eager backward the op's logits output holds
    dlogits, and a second backward through the same graph (retain_graph) fails on the
    in-place change. While the backward is traced (torch.compile, AOTAutograd: the logits are
    then no plain tensor), the same values go to a new tensor instead: a traced graph may not
    mutate a saved activation."""
    targets = targets.contiguous()
    lse, zdz = _glue(_cross_entropy_stats_of_stored, logits, lse.contiguous(), dloss, targets)
    if torch.compiler.is_compiling() or type(logits) is not torch.Tensor:
        dlogits = logits.clone()
        _cross_entropy_grads_into_logits(dlogits, lse, dloss, targets)
        return dlogits, zdz
    _glue(_cross_entropy_grads_into_logits, logits, lse, dloss, targets)
    return logits, zdz


def lm_head_loss_grads(dloss, h, x, rstd, lse, final_norm, w_lm, targets, dlogits=None, zdz=None):
    """The cross-entropy and LM head backward (see decoder_block_loss) -> (dx, dfinal_norm,
    dw_lm): with dlogits and ZdZ given (overwrite_logits_with_dlogits, from k5l's logits) those,
    else both recomputed by a GEMM; then k6 takes the LM head's dgrad and the final norm's
    backward."""
    dloss = dloss.float().contiguous()
    if dlogits is None or not dlogits.numel():
        dlogits, zdz = _cross_entropy_grads_recomputed(dloss, h, rstd, lse, w_lm, targets)
    return lm_head_grads(dlogits, zdz, x, rstd, final_norm, w_lm)


def lm_head_grads(dlogits, zdz, x, rstd, final_norm, w_lm):
    """The LM head's and the final norm's backward from the logits' gradient and its ZdZ row
    sums -> (dx, dfinal_norm, dw_lm): k6 with the LM-head weight in the gate/up weight's place
    (LM-head dgrad + final-norm backward; its accumulate input is zero, the final residual
    stream has no other reader), dw_lm = dlogits^T (xhat * w) from k6's recomputed h."""
    out = _kernel(K6).run({"dz": dlogits.contiguous(), "w_gu": w_lm.contiguous(), "x": x, "rstd": rstd,
                           "norm_weight": final_norm.contiguous(), "dx_in": torch.zeros_like(x), "zdz": zdz}, {})
    return out["dx"], out["dw"].to(final_norm.dtype), dlogits.T @ out["h"]


@torch.library.custom_op("epiforge::decoder_block_loss_backward", mutates_args=())
def decoder_block_loss_backward(dloss: torch.Tensor, lse: torch.Tensor, x: torch.Tensor, h: torch.Tensor,
                                rstd: torch.Tensor, attn: torch.Tensor, x_mid: torch.Tensor, z: torch.Tensor,
                                rstd_mid: torch.Tensor, act: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor,
                                w_gu: torch.Tensor, w_down: torch.Tensor, final_norm: torch.Tensor,
                                w_lm: torch.Tensor, targets: torch.Tensor, dlogits: torch.Tensor, zdz: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                           torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dattn, dresidual, dw_o, dpost_norm, dw_gu, dw_down, dfinal_norm, dw_lm); dlogits
    and zdz empty where the forward did not store the logits (then recomputed here); act the
    forward's kept SwiGLU output, or empty."""
    dx, dfinal_norm, dw_lm = lm_head_loss_grads(dloss, h, x, rstd, lse, final_norm, w_lm, targets, dlogits, zdz)
    return (*attention_out_mlp_grads(dx, dx, attn, w_o, post_norm, w_gu, w_down, x_mid, z, rstd_mid, act),
            dfinal_norm, dw_lm)


@decoder_block_loss_backward.register_fake
def _(dloss, lse, x, h, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, final_norm, w_lm,
      targets, dlogits, zdz):
    return tuple(torch.empty_like(t) for t in (attn, x, w_o, post_norm, w_gu, w_down, final_norm, w_lm))


def _loss_setup(ctx, inputs, output):
    attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, targets, eps, store_logits, keep_act = inputs
    loss, lse, x_mid, z, rstd_mid, x, h, rstd, logits, act = output
    ctx.mark_non_differentiable(lse, x_mid, z, rstd_mid, x, h, rstd, logits, act)
    no_zero_grads(ctx)
    ctx.save_for_backward(lse, x, h, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, final_norm,
                          w_lm, targets, logits)


def _loss_backward(ctx, dloss, *unused):
    if dloss is None:
        return (None,) * 12
    *saved, targets, logits = ctx.saved_tensors
    dloss = dloss.float().contiguous()
    dlogits, zdz = logits, dloss.new_empty(0)
    if logits.numel():
        dlogits, zdz = overwrite_logits_with_dlogits(logits, saved[0], dloss, targets)
    grads = decoder_block_loss_backward(dloss, *saved, targets, dlogits, zdz)
    return (*grads, None, None, None, None)


decoder_block_loss.register_autograd(_loss_backward, setup_context=_loss_setup)


# ---- the last layer after its attention, the final norm and the LM head's logits ----------

K1 = "k1_gemm_rmsnorm"


@torch.library.custom_op("epiforge::decoder_block_logits", mutates_args=())
def decoder_block_logits(attn: torch.Tensor, residual: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor,
                         w_gu: torch.Tensor, w_down: torch.Tensor, final_norm: torch.Tensor, w_lm: torch.Tensor,
                         eps: float, keep_act: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                    torch.Tensor, torch.Tensor]:
    """The last layer after its attention, the final RMSNorm and the LM head, without a loss ->
    (logits, x_mid, z, rstd_mid, x, rstd, act): logits = RMSNorm(x) @ w_lm^T (M, V) bf16, x the
    last layer's output; only logits is differentiable, the rest is saved for the backward
    (act: SwiGLU's output with keep_act, else empty). For evaluation, generation and losses
    of one's own (FusedLlamaModel.forward without targets).
      forward   k0, k2, k0 with the final norm's weight (as in decoder_block_loss), then k1
                (LM-head GEMM + the row scale rstd).
      backward  ZdZ = sum logits * dlogits per row (a compiled row reduction), k6 with the
                LM-head weight (LM-head dgrad + final-norm backward), dw_lm = dlogits^T
                (xhat * w); then k7 -> k6 as in decoder_block."""
    x_mid, rstd_mid, act, z, h, x, rstd = _last_block_kernels("decoder_block_logits", attn, residual, w_o, post_norm,
                                                               w_gu, w_down, final_norm, w_lm, eps)
    logits = _kernel(K1).run({"h": h, "rstd": rstd, "w": w_lm.contiguous()}, {})["out"]
    return logits, x_mid, z, rstd_mid, x, rstd, kept_act(act, keep_act)


@decoder_block_logits.register_fake
def _(attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, eps, keep_act=False):
    m = residual.shape[0]

    def rows():
        return residual.new_empty(m, dtype=torch.float32)

    return (residual.new_empty(m, w_lm.shape[0]), torch.empty_like(residual), residual.new_empty(m, w_gu.shape[0]),
            rows(), torch.empty_like(residual), rows(), kept_act_fake(residual, w_down, keep_act))


def _logits_zdz(logits, dlogits):
    """ZdZ of the final norm's backward: sum_v z_v dz_v per row, float32 (a glue function)."""
    return (logits.float() * dlogits.float()).sum(-1)


@torch.library.custom_op("epiforge::decoder_block_logits_backward", mutates_args=())
def decoder_block_logits_backward(dlogits: torch.Tensor, logits: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                                  attn: torch.Tensor, x_mid: torch.Tensor, z: torch.Tensor, rstd_mid: torch.Tensor,
                                  act: torch.Tensor, w_o: torch.Tensor, post_norm: torch.Tensor, w_gu: torch.Tensor,
                                  w_down: torch.Tensor, final_norm: torch.Tensor, w_lm: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dattn, dresidual, dw_o, dpost_norm, dw_gu, dw_down, dfinal_norm, dw_lm)."""
    zdz = _glue(_logits_zdz, logits, dlogits)
    dx, dfinal_norm, dw_lm = lm_head_grads(dlogits, zdz, x, rstd, final_norm, w_lm)
    return (*attention_out_mlp_grads(dx, dx, attn, w_o, post_norm, w_gu, w_down, x_mid, z, rstd_mid, act),
            dfinal_norm, dw_lm)


@decoder_block_logits_backward.register_fake
def _(dlogits, logits, x, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, final_norm, w_lm):
    return tuple(torch.empty_like(t) for t in (attn, x, w_o, post_norm, w_gu, w_down, final_norm, w_lm))


def _logits_setup(ctx, inputs, output):
    attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, eps, keep_act = inputs
    logits, x_mid, z, rstd_mid, x, rstd, act = output
    ctx.mark_non_differentiable(x_mid, z, rstd_mid, x, rstd, act)
    no_zero_grads(ctx)
    ctx.save_for_backward(logits, x, rstd, attn, x_mid, z, rstd_mid, act, w_o, post_norm, w_gu, w_down, final_norm,
                          w_lm)


def _logits_backward(ctx, dlogits, *unused):
    if dlogits is None:
        return (None,) * 10
    logits = ctx.saved_tensors[0]
    grads = decoder_block_logits_backward(dlogits.to(logits.dtype).contiguous(), *ctx.saved_tensors)
    return (*grads, None, None)


decoder_block_logits.register_autograd(_logits_backward, setup_context=_logits_setup)
