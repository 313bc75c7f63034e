"""Fused training ops as torch.library custom ops (torch >= 2.4: custom_op, register_fake,
register_autograd). Each op's backward is a custom op too, so torch.compile sees one node
each way.

swiglu_mlp(a, w_gu, w_down) -> (y, z): the LLaMA MLP after its RMSNorm, a the normalised
input (M, d), w_gu the gate/up weight (2F, d) with gate and up rows interleaved (row 2j is
gate unit j, row 2j+1 up unit j: the layout k8 and k7 read), w_down (d, F). y = (silu(gate)
* up) @ w_down^T; z = a @ w_gu^T, the pre-activation saved for the backward.
  forward   k8: one GEMM with SwiGLU in its epilogue (z and the activation), then the down
            projection (a plain GEMM).
  backward  k7: the down projection's dgrad GEMM with the SwiGLU backward in its epilogue
            (dz, and the activation recomputed rather than saved), then the weight
            gradients and the input gradient (plain GEMMs). k7's third output, the ZdZ
            row sums, serves the RMSNorm backward upstream; this op does not need it.

The decoder layer's two ops (training/layer.py), the block re-cut of
../shared/notes/coda-workloads.md around torch's attention:
rmsnorm_qkv_rope(x, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps) -> (qkv, rstd)
  forward   torch h = x * w and rstd, then k4hf (QKV GEMM + row scale + HF-direction RoPE).
  backward  torch RoPE backward and ZdZ, then k6 (QKV dgrad + RMSNorm backward).
attention_out_mlp(attn, residual, w_o, norm_weight, w_gu, w_down, eps, keep_act) -> (y, x, z, rstd, act)
  forward   k0 (O-proj + residual + partial RMSNorm), k2 (gate/up + row scale + SwiGLU),
            the down projection + residual as a plain addmm.
  backward  k7 (down dgrad + SwiGLU backward + ZdZ), k6 fed k7's ZdZ (gate/up dgrad +
            RMSNorm backward + residual gradient), plain GEMMs for the rest.
  keep_act  SwiGLU's forward output kept for the backward (M x F bf16 per layer), so the
            backward's k7 is its epilogue without the postact store (one of its three
            M x F stores); the model ops (training/model_ops.py) take it too.
The expert kernels are trusted code (human_kernels/), imported once here; on CPU tensors
they run through the emulator.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

import torch

K8 = "k8_gemm_swiglu"
K7 = "k7_gemm_partial_swiglu_bwd"


@lru_cache(maxsize=None)
def _kernel(task_name: str):
    from epiforge.eval.kernel import load_kernel_module
    from epiforge.eval.machine import expert_kernel

    return load_kernel_module(expert_kernel(task_name))


def _check(a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> None:
    m, d = a.shape
    two_f, d2 = w_gu.shape
    if d2 != d or two_f % 2 or tuple(w_down.shape) != (d, two_f // 2):
        raise ValueError(f"swiglu_mlp: a {tuple(a.shape)}, w_gu {tuple(w_gu.shape)} and w_down "
                         f"{tuple(w_down.shape)} do not fit (want (M, d), (2F, d), (d, F))")
    if not (a.dtype == w_gu.dtype == w_down.dtype == torch.bfloat16):
        raise ValueError("swiglu_mlp: the expert kernels take bfloat16 operands")


@torch.library.custom_op("epiforge::swiglu_mlp", mutates_args=())
def swiglu_mlp(a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check(a, w_gu, w_down)
    out = _kernel(K8).run({"a": a.contiguous(), "w_gu": w_gu.contiguous()}, {})
    return out["out"] @ w_down.T, out["z"]


@swiglu_mlp.register_fake
def _(a, w_gu, w_down):
    return a.new_empty(a.shape[0], w_down.shape[0]), a.new_empty(a.shape[0], w_gu.shape[0])


@torch.library.custom_op("epiforge::swiglu_mlp_backward", mutates_args=())
def swiglu_mlp_backward(dy: torch.Tensor, a: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor,
                        z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = _kernel(K7).run({"dout": dy.contiguous(), "w_down": w_down.contiguous(), "z": z.contiguous()}, {})
    dz, act = out["dz"], out["out"]
    return dz @ w_gu, dz.T @ a, dy.T @ act  # da, dw_gu, dw_down


@swiglu_mlp_backward.register_fake
def _(dy, a, w_gu, w_down, z):
    return torch.empty_like(a), torch.empty_like(w_gu), torch.empty_like(w_down)


def no_zero_grads(ctx) -> None:
    """In an op's setup_context: the gradients of outputs that nothing used (the saved
    activations an op returns, mark_non_differentiable's outputs included) reach its
    backward as None, not as zero tensors autograd fills first: in the 1B step about 9 GiB
    of bf16 zeros (every block's x_mid and its M x 2F z), the size of the bf16 FillFunctor
    kernel's 3.0 ms there (lab/results/h200/training/step-configs-2.json)."""
    ctx.set_materialize_grads(False)


def _setup(ctx, inputs, output):
    a, w_gu, w_down = inputs
    no_zero_grads(ctx)
    ctx.save_for_backward(a, w_gu, w_down, output[1])


def _backward(ctx, dy, dz_unused):
    a, w_gu, w_down, z = ctx.saved_tensors
    if dy is None:
        return None, None, None
    return swiglu_mlp_backward(dy.to(a.dtype), a, w_gu, w_down, z)


swiglu_mlp.register_autograd(_backward, setup_context=_setup)


# ---- the layer's attention input: RMSNorm -> QKV projection -> RoPE (k4hf) ----------------

K4HF = "k4hf_gemm_rmsnorm_rope"
K6 = "k6_gemm_residual_partial_rmsnorm_bwd"
K0 = "k0_gemm_residual_partial_rmsnorm"
K2 = "k2_gemm_rmsnorm_swiglu"


def rotate_adjacent_pairs(z: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                          rotary_cols: int, direction: int = 1) -> torch.Tensor:
    """RoPE as the kernels lay it out: columns (2j, 2j+1) of every head in the first
    `rotary_cols` columns of z rotate by direction * positions[m] * inv_freq[j],
    (x, y) -> (x cos - y sin, x sin + y cos); the other columns pass through. direction +1 is
    Hugging Face LLaMA's rotation (after the pairing permutation, see training/layer.py); -1
    is its inverse, the RoPE backward. Angles in float64, the rotation in z's precision."""
    m, head_dim = z.shape[0], 2 * inv_freq.shape[0]
    angle = direction * positions.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = (f(angle).to(z.dtype)[:, None, :] for f in (torch.cos, torch.sin))
    pairs = z[:, :rotary_cols].reshape(m, rotary_cols // head_dim, head_dim // 2, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((x * cos - y * sin, x * sin + y * cos), dim=-1).reshape(m, rotary_cols)
    return torch.cat((rotated, z[:, rotary_cols:]), dim=1)


def _row_rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x.float().pow(2).mean(-1) + eps)


@torch.library.custom_op("epiforge::rmsnorm_qkv_rope", mutates_args=())
def rmsnorm_qkv_rope(x: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor, positions: torch.Tensor,
                     inv_freq: torch.Tensor, rotary_cols: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x) @ w_qkv^T with RoPE on the first `rotary_cols` columns (q and k heads; v
    passes through) -> (qkv, rstd). w_qkv is (n_q + 2 n_kv heads) x head_dim rows [q; k; v],
    rotary pairs adjacent within each head; positions (M,) float32; rstd (M,) float32 is saved
    for the backward.
      forward   the deferred RMSNorm: h = x * norm_weight and rstd in torch (in the fused
                model, training/model_ops.py, the previous layer's down projection, k0, writes both), then
                k4hf: the QKV GEMM with the row scale rstd and RoPE in its epilogue. k4hf,
                not k4: it rotates by +angle as Hugging Face LLaMA does (k4 follows CODA
                v0.1's -angle). Its own prepare() assumes q, k, v all d wide; here the
                frequency table is built for GQA widths (rotary_cols, then v's columns at 0).
      backward  see rmsnorm_qkv_rope_backward: RoPE backward (P.finish.rope_backward), then k6."""
    m, d = x.shape
    if tuple(norm_weight.shape) != (d,) or w_qkv.shape[1] != d or rotary_cols % (2 * inv_freq.shape[0]) \
            or not 0 < rotary_cols < w_qkv.shape[0] or tuple(positions.shape) != (m,):
        raise ValueError(f"rmsnorm_qkv_rope: x {tuple(x.shape)}, norm_weight {tuple(norm_weight.shape)}, w_qkv "
                         f"{tuple(w_qkv.shape)}, positions {tuple(positions.shape)}, rotary_cols {rotary_cols} "
                         "do not fit")
    if not (x.dtype == norm_weight.dtype == w_qkv.dtype == torch.bfloat16):
        raise ValueError("rmsnorm_qkv_rope: the expert kernels take bfloat16 operands")
    h = (x.float() * norm_weight.float()).to(x.dtype)
    rstd = _row_rstd(x, eps)
    return qkv_rope_kernel(h, rstd, w_qkv, positions, inv_freq, rotary_cols), rstd


def qkv_rope_kernel(h: torch.Tensor, rstd: torch.Tensor, w_qkv: torch.Tensor, positions: torch.Tensor,
                    inv_freq: torch.Tensor, rotary_cols: int) -> torch.Tensor:
    """k4hf on a deferred RMSNorm: rstd * (h @ w_qkv^T), RoPE on the first rotary_cols columns.
    Its own prepare() assumes q, k, v all d wide; the frequency table here is built for GQA
    widths (rotary_cols, then v's columns at frequency 0)."""
    from epiforge import primitives as P

    kernel = _kernel(K4HF)
    freq = P.prepare.rope_freq_table(inv_freq.float(), 2 * inv_freq.shape[0], rotary_cols=rotary_cols,
                                     passthrough_cols=w_qkv.shape[0] - rotary_cols, direction=kernel.ROPE_DIRECTION)
    out = kernel.qkv_rmsnorm_rope(h.contiguous(), w_qkv.contiguous(), rstd=rstd, pos=positions.float().contiguous(),
                                  freq=freq, config=P.pick_config(kernel.TUNED, h, w_qkv))
    return out["D"]


@rmsnorm_qkv_rope.register_fake
def _(x, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps):
    return x.new_empty(x.shape[0], w_qkv.shape[0]), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("epiforge::rmsnorm_qkv_rope_backward", mutates_args=())
def rmsnorm_qkv_rope_backward(dqkv: torch.Tensor, qkv: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                              norm_weight: torch.Tensor, w_qkv: torch.Tensor, positions: torch.Tensor,
                              inv_freq: torch.Tensor, rotary_cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dx, dnorm_weight, dw_qkv).
    RoPE backward by the finishing step P.finish.rope_backward (no GEMM epilogue covers it:
    it belongs in attention's backward): the inverse rotation of dqkv gives dz at the
    pre-RoPE projection, and in the same pass ZdZ: the rotation is orthogonal, so sum_k z_k
    dz_k = sum_k qkv_k dqkv_k, from the saved output.
    Then k6 with the QKV weight in the place of the gate/up weight (its GEMM and epilogue do
    not depend on what the rows mean): g = dz @ w_qkv, dx = rstd * (w*g - xhat * zdz/d), the
    normalised input recomputed for dw_qkv = dz^T (xhat * w), and the norm weight's
    gradient. k6's residual input dx_in is zero here: autograd adds x's residual-path
    gradient (training/model_ops.py's ops pass it in instead, saving that add)."""
    return qkv_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols,
                          torch.zeros_like(x))


#: the glue functions compiled so far (CUDA only), by function
_COMPILED: dict = {}
_EAGER_GLUE = []


@contextmanager
def eager_glue():
    """Inside: the torch glue between the fused GEMMs runs eagerly on CUDA too (an ablation;
    by default torch.compile fuses each glue function into one kernel on CUDA tensors)."""
    _EAGER_GLUE.append(True)
    try:
        yield
    finally:
        _EAGER_GLUE.pop()


def _glue(fn, *args):
    """fn(*args): the torch work between two fused GEMMs (elementwise passes and row sums over
    an M x N tensor). On CUDA it runs compiled (one fused kernel instead of a dozen passes over
    memory, shapes specialised); on a CPU eagerly (the emulator's tests need no compiler)."""
    if _EAGER_GLUE or not args[0].is_cuda:
        return fn(*args)
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[fn](*args)


def qkv_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols: int, dx_in):
    """The backward of RMSNorm -> QKV -> RoPE with dx_in, the residual stream's other
    gradient, as k6's accumulate input -> (dx_in + dx through the norm, dnorm_weight, dw_qkv)."""
    from epiforge import primitives as P

    # RoPE's backward and ZdZ in one pass: the finishing step the layer task's kernel uses
    # (one Triton kernel on CUDA, float32 angles per pair). The compiled glue that did it
    # here before took 8.66 ms of the 1B step (step-configs-2.json): its float64 cos / sin
    # went into its per-element kernel.
    dz, zdz = P.finish.rope_backward(dqkv.contiguous(), qkv.contiguous(), positions.contiguous(),
                                     inv_freq.contiguous(), rotary_cols, 1)
    out = _kernel(K6).run({"dz": dz, "w_gu": w_qkv.contiguous(), "x": x.contiguous(), "rstd": rstd.contiguous(),
                           "norm_weight": norm_weight.contiguous(), "dx_in": dx_in.contiguous(), "zdz": zdz}, {})
    return out["dx"], out["dw"].to(norm_weight.dtype), dz.T @ out["h"]


@rmsnorm_qkv_rope_backward.register_fake
def _(dqkv, qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq, rotary_cols):
    return torch.empty_like(x), torch.empty_like(norm_weight), torch.empty_like(w_qkv)


def _qkv_setup(ctx, inputs, output):
    x, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps = inputs
    qkv, rstd = output
    no_zero_grads(ctx)
    ctx.mark_non_differentiable(rstd)
    ctx.rotary_cols = rotary_cols
    ctx.save_for_backward(qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq)


def _qkv_backward(ctx, dqkv, drstd_unused):
    qkv, x, rstd, norm_weight, w_qkv, positions, inv_freq = ctx.saved_tensors
    if dqkv is None:
        return (None,) * 7
    dx, dnorm, dw_qkv = rmsnorm_qkv_rope_backward(dqkv.to(x.dtype).contiguous(), qkv, x, rstd, norm_weight, w_qkv,
                                                  positions, inv_freq, ctx.rotary_cols)
    return dx, dnorm, dw_qkv, None, None, None, None


rmsnorm_qkv_rope.register_autograd(_qkv_backward, setup_context=_qkv_setup)


# ---- the layer after attention: O-proj + residual + RMSNorm -> SwiGLU MLP + residual -------


@torch.library.custom_op("epiforge::attention_out_mlp", mutates_args=())
def attention_out_mlp(attn: torch.Tensor, residual: torch.Tensor, w_o: torch.Tensor, norm_weight: torch.Tensor,
                      w_gu: torch.Tensor, w_down: torch.Tensor, eps: float, keep_act: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block re-cut's [out-proj + residual + partial norm] -> rstd -> [gate/up + row scale
    + SwiGLU] -> [down-proj + residual], -> (y, x, z, rstd, act):
    x = attn @ w_o^T + residual (the residual stream after attention), y = x +
    (silu(gate) * up)(RMSNorm(x) @ w_gu^T) @ w_down^T; z (the interleaved gate/up
    pre-activation) and rstd (M,) float32 are saved for the backward and not differentiable.
    act: with keep_act, SwiGLU's output (M, F) kept for the backward (see kept_act), else an
    empty tensor. w_gu (2F, d) has gate and up rows interleaved (row 2j gate j, 2j+1 up j).
      forward   k0: the out-projection GEMM, the residual add, h = x * norm_weight and rstd
                (its finishing step); k2: the gate/up GEMM with the row scale rstd and
                SwiGLU in its epilogue; the down projection and its residual add are a plain
                addmm (in the fused model, training/model_ops.py: k0 again, with the next layer's norm).
      backward  see attention_out_mlp_backward: k7, then k6 fed k7's ZdZ.
    One op, not one per kernel, because of that ZdZ: k6 (the RMSNorm backward of k0's norm)
    needs k7's dz, its zdz row sums and the gate/up weight, which all live in the MLP's
    backward; inside one autograd node they pass from k7 to k6 directly."""
    m, d = residual.shape
    two_f = w_gu.shape[0]
    if tuple(attn.shape) != (m, w_o.shape[1]) or w_o.shape[0] != d or tuple(norm_weight.shape) != (d,) \
            or w_gu.shape[1] != d or two_f % 2 or tuple(w_down.shape) != (d, two_f // 2):
        raise ValueError(f"attention_out_mlp: attn {tuple(attn.shape)}, residual {tuple(residual.shape)}, w_o "
                         f"{tuple(w_o.shape)}, norm_weight {tuple(norm_weight.shape)}, w_gu {tuple(w_gu.shape)}, "
                         f"w_down {tuple(w_down.shape)} do not fit (want (M, n), (M, d), (d, n), (d,), (2F, d), (d, F))")
    if not all(t.dtype == torch.bfloat16 for t in (attn, residual, w_o, norm_weight, w_gu, w_down)):
        raise ValueError("attention_out_mlp: the expert kernels take bfloat16 operands")
    x, rstd, act, z = attention_out_swiglu_kernels(attn, residual, w_o, norm_weight, w_gu, eps)
    return torch.addmm(x, act, w_down.T), x, z, rstd, kept_act(act, keep_act)


def kept_act(act: torch.Tensor, keep_act: bool) -> torch.Tensor:
    """The ops' keep_act: SwiGLU's forward output (M, F) kept for the backward, so the
    backward's down-projection dgrad stores no second copy (swiglu_backward_kept_act instead
    of k7) and the down projection's weight gradient reads this one. It costs M x F x 2 bytes
    per layer, held from the forward to the backward (256 MiB at M = 16384, F = 8192); it
    saves k7's postact store (one of its three M x F stores). Off: an empty tensor (a custom
    op returns tensors, not None)."""
    return act if keep_act else act.new_empty(0)


@lru_cache(maxsize=None)
def swiglu_backward_kept_act_epilogue():
    """k7's epilogue less its postact output, for a backward that has the forward's SwiGLU
    output (keep_act): the down projection's dgrad GEMM acc = dy @ w_down, C = z (the packed
    (gate, up) pre-activation), D = dz packed like z, and the ZdZ row sums of z * dz."""
    from epiforge import primitives as P

    @P.epilogue(reductions={"zdz": P.RowReduce()}, mode="packed_pair")
    def swiglu_backward_kept_act(acc, c):
        gate, up = P.unpack(c)
        d_gate, d_up, _ = P.dswiglu(gate, up, acc)
        return {"D": P.pack(d_gate, d_up), "zdz": gate * d_gate + up * d_up}

    return swiglu_backward_kept_act


def swiglu_backward_kernels(dy: torch.Tensor, w_down: torch.Tensor, z: torch.Tensor, act: torch.Tensor):
    """The down projection's dgrad with the SwiGLU backward in its epilogue -> (dz, zdz, act):
    k7, whose act is recomputed and stored, or, with a kept act (non-empty), k7's epilogue
    without that store at k7's tile config, passing the kept act on."""
    from epiforge import primitives as P

    if not act.numel():
        k7 = _kernel(K7).run({"dout": dy.contiguous(), "w_down": w_down.contiguous(), "z": z.contiguous()}, {})
        return k7["dz"], k7["zdz"], k7["out"]
    w = w_down.contiguous().T  # acc = dy @ w_down: B = w_down^T, (N = F, K = d)
    out = swiglu_backward_kept_act_epilogue()(dy.contiguous(), w, c=z.contiguous(),
                                              config=P.pick_config(_kernel(K7).TUNED, dy, w))
    return out["D"], P.finish.row_sum(out["zdz"]), act


def attention_out_swiglu_kernels(attn, residual, w_o, norm_weight, w_gu, eps: float):
    """k0 (out-proj + residual + partial norm, rstd finished) then k2 (gate/up + row scale +
    SwiGLU) -> (x, rstd, act, z): the residual stream, its 1/rms, SwiGLU's output, the
    interleaved gate/up pre-activation."""
    h, x, rstd = residual_rmsnorm_kernel(attn, w_o, residual, norm_weight, eps)
    k2 = _kernel(K2).run({"h": h, "rstd": rstd, "w_gu": w_gu.contiguous()}, {})
    return x, rstd, k2["out"], k2["z"]


def residual_rmsnorm_kernel(a, w, residual, norm_weight, eps: float):
    """k0: x = a @ w^T + residual, h = x * norm_weight, rstd = 1/rms(x) -> (h, x, rstd). Its
    task names the out-projection, but the GEMM is any (M, K) x (N=d, K) one: the down
    projection + residual + the next norm's partial is k0 too."""
    k0 = _kernel(K0).run({"a": a.contiguous(), "w_o": w.contiguous(), "residual": residual.contiguous(),
                          "norm_weight": norm_weight.contiguous(), "eps": eps}, {})
    return k0["h"], k0["x"], k0["rstd"]


@attention_out_mlp.register_fake
def _(attn, residual, w_o, norm_weight, w_gu, w_down, eps, keep_act=False):
    m = residual.shape[0]
    return (torch.empty_like(residual), torch.empty_like(residual), residual.new_empty(m, w_gu.shape[0]),
            residual.new_empty(m, dtype=torch.float32), kept_act_fake(residual, w_down, keep_act))


def kept_act_fake(residual: torch.Tensor, w_down: torch.Tensor, keep_act: bool) -> torch.Tensor:
    """kept_act's tensor in a fake implementation: (M, F), or empty."""
    return residual.new_empty(residual.shape[0], w_down.shape[1]) if keep_act else residual.new_empty(0)


@torch.library.custom_op("epiforge::attention_out_mlp_backward", mutates_args=())
def attention_out_mlp_backward(dy: torch.Tensor, dx_extra: torch.Tensor, attn: torch.Tensor, w_o: torch.Tensor,
                               norm_weight: torch.Tensor, w_gu: torch.Tensor, w_down: torch.Tensor, x: torch.Tensor,
                               z: torch.Tensor, rstd: torch.Tensor, act: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dattn, dresidual, dw_o, dnorm_weight, dw_gu, dw_down). dx_extra is a gradient
    arriving at the op's x output directly (zeros when x is not used outside); act the
    forward's kept SwiGLU output, or empty.
      k7: the down projection's dgrad GEMM dy @ w_down, the SwiGLU backward in its epilogue:
          dz, the activation recomputed (for dw_down = dy^T act) and the ZdZ row sums; with
          a kept act, the same epilogue without the activation (swiglu_backward_kernels).
      k6: the gate/up dgrad GEMM dz @ w_gu with the RMSNorm backward in its epilogue, fed
          k7's zdz, and the residual gradient dy + dx_extra as its accumulate input: dx (the
          gradient of the residual stream after attention), the normalised input recomputed
          (for dw_gu = dz^T (xhat * w)) and the norm weight's gradient.
      torch: the out-projection's dgrad and wgrad GEMMs; the residual's gradient is dx."""
    return attention_out_mlp_grads(dy, dy + dx_extra, attn, w_o, norm_weight, w_gu, w_down, x, z, rstd, act)


def attention_out_mlp_grads(dy, dx_in, attn, w_o, norm_weight, w_gu, w_down, x, z, rstd, act):
    """k7 (down dgrad + SwiGLU backward + ZdZ; without its act store where act, the forward's,
    is kept) -> k6 (gate/up dgrad + RMSNorm backward, dx_in as its accumulate input: the
    residual stream x's gradient from everything but its norm) -> (dattn, dresidual, dw_o,
    dnorm_weight, dw_gu, dw_down), out-projection GEMMs plain."""
    dz, zdz, act = swiglu_backward_kernels(dy, w_down, z, act)
    k6 = _kernel(K6).run({"dz": dz, "w_gu": w_gu.contiguous(), "x": x.contiguous(), "rstd": rstd.contiguous(),
                          "norm_weight": norm_weight.contiguous(), "dx_in": dx_in.contiguous(), "zdz": zdz}, {})
    dx = k6["dx"]
    return dx @ w_o, dx, dx.T @ attn, k6["dw"].to(norm_weight.dtype), dz.T @ k6["h"], dy.T @ act


@attention_out_mlp_backward.register_fake
def _(dy, dx_extra, attn, w_o, norm_weight, w_gu, w_down, x, z, rstd, act):
    return (torch.empty_like(attn), torch.empty_like(x), torch.empty_like(w_o), torch.empty_like(norm_weight),
            torch.empty_like(w_gu), torch.empty_like(w_down))


def _mlp_block_setup(ctx, inputs, output):
    attn, residual, w_o, norm_weight, w_gu, w_down, eps, keep_act = inputs
    y, x, z, rstd, act = output
    no_zero_grads(ctx)
    ctx.mark_non_differentiable(z, rstd, act)
    ctx.save_for_backward(attn, w_o, norm_weight, w_gu, w_down, x, z, rstd, act)


def _mlp_block_backward(ctx, dy, dx_extra, *unused):
    attn, w_o, norm_weight, w_gu, w_down, x, z, rstd, act = ctx.saved_tensors
    if dy is None and dx_extra is None:
        return (None,) * 8
    dy = torch.zeros_like(x) if dy is None else dy
    dx_extra = torch.zeros_like(x) if dx_extra is None else dx_extra.to(x.dtype).contiguous()
    grads = attention_out_mlp_backward(dy.to(x.dtype).contiguous(), dx_extra, attn, w_o, norm_weight, w_gu, w_down,
                                       x, z, rstd, act)
    return (*grads, None, None)


attention_out_mlp.register_autograd(_mlp_block_backward, setup_context=_mlp_block_setup)


# ---- Qwen3's attention input: RMSNorm -> QKV -> per-head QK-norm -> RoPE (qkn) ------------

QKN = "qkn_gemm_qknorm_rope"
#: the QK-norm's epsilon: the qkn kernel's HeadRMS compiles it in (Qwen3's rms_norm_eps)
QK_NORM_EPS = 1e-6
#: the head widths the qkn kernel has an epilogue for (its EPILOGUES)
QK_NORM_HEAD_DIMS = (64, 128, 256)


def _qk_split(w_qkv: torch.Tensor, rotary_cols: int, head_dim: int) -> tuple[int, int]:
    """(q heads, kv heads) of rows [q; k; v] with rotary_cols = q + k columns."""
    kv_cols = w_qkv.shape[0] - rotary_cols
    return (rotary_cols - kv_cols) // head_dim, kv_cols // head_dim


def _head_norm_weight(q_norm: torch.Tensor, k_norm: torch.Tensor, n_q: int, n_kv: int) -> torch.Tensor:
    """The per-column weight of the [q | k] columns: q_norm over every q head, k_norm over every k head."""
    return torch.cat((q_norm.float().repeat(n_q), k_norm.float().repeat(n_kv)))


@torch.library.custom_op("epiforge::rmsnorm_qk_norm_rope", mutates_args=())
def rmsnorm_qk_norm_rope(x: torch.Tensor, norm_weight: torch.Tensor, w_qkv: torch.Tensor, q_norm: torch.Tensor,
                         k_norm: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, rotary_cols: int,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's attention input -> (qkv, rstd): a = RMSNorm(x); the q and k columns of
    a @ w_qkv^T get a per-head RMSNorm (eps QK_NORM_EPS) with weight q_norm or k_norm
    (head_dim,), then RoPE; v's columns pass. Rows of w_qkv [q; k; v], rotary pairs adjacent.
      forward   the input norm in torch (qkn takes the normalised a: its head statistic is not
                invariant to a deferred row scale because of eps), then qkn (the Q/K GEMM
                with the per-head norm and RoPE in its epilogue) on w_qkv's q and k rows; v
                is a plain GEMM.
      backward  see rmsnorm_qk_norm_rope_backward: torch (no kernel covers the QK-norm
                backward), then k6."""
    m, d = x.shape
    head_dim = 2 * inv_freq.shape[0]
    if tuple(norm_weight.shape) != (d,) or w_qkv.shape[1] != d or rotary_cols % head_dim \
            or not 0 < rotary_cols < w_qkv.shape[0] or tuple(positions.shape) != (m,) \
            or tuple(q_norm.shape) != (head_dim,) or tuple(k_norm.shape) != (head_dim,):
        raise ValueError(f"rmsnorm_qk_norm_rope: x {tuple(x.shape)}, norm_weight {tuple(norm_weight.shape)}, w_qkv "
                         f"{tuple(w_qkv.shape)}, q_norm {tuple(q_norm.shape)}, k_norm {tuple(k_norm.shape)}, positions "
                         f"{tuple(positions.shape)}, rotary_cols {rotary_cols} do not fit")
    if not all(t.dtype == torch.bfloat16 for t in (x, norm_weight, w_qkv, q_norm, k_norm)):
        raise ValueError("rmsnorm_qk_norm_rope: the expert kernels take bfloat16 operands")
    rstd = _row_rstd(x, eps)
    return qk_norm_rope_kernel(normalised(x, rstd, norm_weight), w_qkv, q_norm, k_norm, positions, inv_freq,
                               rotary_cols), rstd


def normalised(x: torch.Tensor, rstd: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm's output x * rstd * w, rounded once to x's dtype (what qkn reads)."""
    return (x.float() * rstd[:, None] * norm_weight.float()).to(x.dtype).contiguous()


def qk_norm_rope_kernel(a, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols: int) -> torch.Tensor:
    """qkn on the q and k rows of w_qkv (per-head RMSNorm + RoPE in the epilogue), v's rows a
    plain GEMM -> qkv."""
    from epiforge import primitives as P

    head_dim = 2 * inv_freq.shape[0]
    kernel = _kernel(QKN)
    if kernel.EPS != QK_NORM_EPS or head_dim not in kernel.EPILOGUES:
        raise ValueError(f"rmsnorm_qk_norm_rope: qkn has eps {kernel.EPS} and head widths {sorted(kernel.EPILOGUES)}; "
                         f"here {QK_NORM_EPS} and {head_dim}")
    weight = _head_norm_weight(q_norm, k_norm, *_qk_split(w_qkv, rotary_cols, head_dim))
    freq = P.prepare.rope_freq_table(inv_freq.float(), head_dim, rotary_cols=rotary_cols, direction=1)
    qk = kernel.EPILOGUES[head_dim](a, w_qkv[:rotary_cols].contiguous(), w=weight, pos=positions.float().contiguous(),
                                    freq=freq, config=kernel.CONFIGS[head_dim])["D"]
    return torch.cat((qk, a @ w_qkv[rotary_cols:].T), dim=1)


@rmsnorm_qk_norm_rope.register_fake
def _(x, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols, eps):
    return x.new_empty(x.shape[0], w_qkv.shape[0]), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("epiforge::rmsnorm_qk_norm_rope_backward", mutates_args=())
def rmsnorm_qk_norm_rope_backward(dqkv: torch.Tensor, qkv: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                                  norm_weight: torch.Tensor, w_qkv: torch.Tensor, q_norm: torch.Tensor,
                                  k_norm: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                                  rotary_cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                             torch.Tensor]:
    """-> (dx, dnorm_weight, dw_qkv, dq_norm, dk_norm).
    torch, float32: the RoPE backward (inverse rotation), then the per-head RMSNorm backward
    from the recomputed pre-norm projection z = a @ w_qk^T (a GEMM; qkn stores only its
    output): with r the head's 1/rms and n = z r, dz = r (dn - n mean(dn n)), dn = dy * w;
    the norm weights' gradients sum dy * n over rows and heads. Then k6 (QKV dgrad + the
    input RMSNorm backward) on [dz_q, dz_k, dv] with ZdZ = sum z dz over all columns (v's z is
    the op's own v output)."""
    return qk_norm_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols,
                              torch.zeros_like(x))


def qk_norm_rope_grads(dqkv, qkv, x, rstd, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols: int,
                       dx_in):
    """rmsnorm_qk_norm_rope's backward with dx_in, the residual stream's other gradient, as
    k6's accumulate input -> (dx, dnorm_weight, dw_qkv, dq_norm, dk_norm)."""
    m, d = x.shape
    head_dim = 2 * inv_freq.shape[0]
    n_q, n_kv = _qk_split(w_qkv, rotary_cols, head_dim)
    dy = rotate_adjacent_pairs(dqkv[:, :rotary_cols].float(), positions, inv_freq, rotary_cols, direction=-1)
    a = normalised(x, rstd, norm_weight)
    z = (a.float() @ w_qkv[:rotary_cols].float().T).reshape(m, n_q + n_kv, head_dim)
    r = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + QK_NORM_EPS)
    normed = z * r
    dy = dy.reshape(m, n_q + n_kv, head_dim)
    dnormed = dy * _head_norm_weight(q_norm, k_norm, n_q, n_kv).reshape(n_q + n_kv, head_dim)
    dz_qk = r * (dnormed - normed * (dnormed * normed).mean(-1, keepdim=True))
    dweight = (dy * normed).sum(0)
    dz = torch.cat((dz_qk.reshape(m, rotary_cols), dqkv[:, rotary_cols:].float()), dim=1).to(x.dtype).contiguous()
    zdz = (z.reshape(m, rotary_cols) * dz[:, :rotary_cols].float()).sum(-1) \
        + (qkv[:, rotary_cols:].float() * dz[:, rotary_cols:].float()).sum(-1)
    out = _kernel(K6).run({"dz": dz, "w_gu": w_qkv.contiguous(), "x": x.contiguous(), "rstd": rstd.contiguous(),
                           "norm_weight": norm_weight.contiguous(), "dx_in": dx_in.contiguous(), "zdz": zdz}, {})
    return (out["dx"], out["dw"].to(norm_weight.dtype), dz.T @ out["h"], dweight[:n_q].sum(0).to(q_norm.dtype),
            dweight[n_q:].sum(0).to(k_norm.dtype))


@rmsnorm_qk_norm_rope_backward.register_fake
def _(dqkv, qkv, x, rstd, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols):
    return (torch.empty_like(x), torch.empty_like(norm_weight), torch.empty_like(w_qkv), torch.empty_like(q_norm),
            torch.empty_like(k_norm))


def _qk_norm_setup(ctx, inputs, output):
    x, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols, eps = inputs
    qkv, rstd = output
    no_zero_grads(ctx)
    ctx.mark_non_differentiable(rstd)
    ctx.rotary_cols = rotary_cols
    ctx.save_for_backward(qkv, x, rstd, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq)


def _qk_norm_backward(ctx, dqkv, drstd_unused):
    qkv, x, *rest = ctx.saved_tensors
    if dqkv is None:
        return (None,) * 9
    grads = rmsnorm_qk_norm_rope_backward(dqkv.to(x.dtype).contiguous(), qkv, x, *rest, ctx.rotary_cols)
    return (*grads, None, None, None, None)


rmsnorm_qk_norm_rope.register_autograd(_qk_norm_backward, setup_context=_qk_norm_setup)
