"""A LLaMA-3 decoder layer whose non-attention part runs as GEMM-epilogue programs, forward
and backward (training/ops.py), and an unfused float32 reference with the same parameters.

    x -> [RMSNorm -> QKV -> RoPE]  rmsnorm_qkv_rope  (k4hf; backward: torch RoPE^-1, k6)
         (qk_norm, Qwen3: [RMSNorm -> QKV -> per-head QK-norm -> RoPE] rmsnorm_qk_norm_rope:
          torch input norm, qkv's q/k through qkn, v a plain GEMM; backward torch, then k6)
      -> causal GQA attention       torch scaled_dot_product_attention (and its autograd)
      -> [O-proj + residual + RMSNorm -> gate/up + SwiGLU -> down-proj + residual]
                                    attention_out_mlp (k0, k2, addmm; backward: k7 -> k6)

Parameters (the kernels' layout; FusedLlamaLayer.load_hf_state_dict converts once):
    input_norm (d,), post_norm (d,), w_qkv ((n_heads + 2 n_kv_heads) head_dim, d) = rows
    [q; k; v], w_o (d, n_heads head_dim), w_gu (2 ffn, d), w_down (d, ffn).
The two layout changes from Hugging Face's, made at load time and undone by to_hf_state_dict:
  - gate/up interleave: w_gu row 2j = gate_proj row j, row 2j+1 = up_proj row j, so SwiGLU
    reads adjacent column pairs of the gate/up GEMM (k2, k7).
  - RoPE pairing: HF's rotate_half pairs column j of a head with j + head_dim/2; the kernels
    pair adjacent columns (2j, 2j+1). Within every q and k head the rows of q_proj and k_proj
    are reordered [0, h/2, 1, h/2+1, ...] (h = head_dim), so kernel pair j is HF's pair
    (j, j + h/2), which rotates by the same angle pos * inv_freq[j]. q and k get the same
    permutation, so q . k per head, and with it attention, is unchanged; v and o_proj are not
    touched. With qk_norm, q_norm and k_norm are permuted the same way (a head's mean square
    does not depend on the column order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from epiforge.training.ops import (
    QK_NORM_EPS,
    QK_NORM_HEAD_DIMS,
    attention_out_mlp,
    rmsnorm_qk_norm_rope,
    rmsnorm_qkv_rope,
    rotate_adjacent_pairs,
)


@dataclass(frozen=True)
class LlamaLayerConfig:
    """One decoder layer's sizes; defaults are LLaMA-3's eps and RoPE theta. inv_freq is the
    plain theta^(-2j/head_dim): LLaMA-3.1/3.2's rope_scaling ("llama3" rope_type) is not
    applied (the kernels take any inv_freq; a scaled one would be a drop-in).
    qk_norm: Qwen3's per-head RMSNorm of q and k before RoPE (weights q_norm, k_norm of
    head_dim each; its eps is QK_NORM_EPS, the qkn kernel's); Qwen3 sets rope_theta 1e6 and
    eps 1e-6."""

    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-5
    rope_theta: float = 500000.0
    qk_norm: bool = False

    def __post_init__(self):
        if min(self.d, self.n_heads, self.n_kv_heads, self.head_dim, self.ffn) < 1:
            raise ValueError(f"{self}: every size must be at least 1")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"{self}: n_heads must be a multiple of n_kv_heads and head_dim even")

    def fused_kernel_problems(self) -> list[str]:
        """What these sizes break in the fused kernels (none: an empty list), checked when a
        fused layer or model is built rather than at its first forward, deep in a kernel: each
        GEMM's K and N must be multiples of 8 (its TMA moves 16-byte rows of bf16), and
        QK-norm needs a head width the qkn kernel was built for."""
        widths = {"d": self.d, "ffn": self.ffn, "n_heads * head_dim": self.q_cols,
                  "(n_heads + 2 n_kv_heads) * head_dim": self.q_cols + 2 * self.kv_cols}
        problems = [f"{name} = {n} is not a multiple of 8" for name, n in widths.items() if n % 8]
        if self.qk_norm and self.head_dim not in QK_NORM_HEAD_DIMS:
            problems.append(f"qk_norm needs head_dim in {QK_NORM_HEAD_DIMS}, not {self.head_dim}")
        return problems

    @property
    def q_cols(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_cols(self) -> int:
        return self.n_kv_heads * self.head_dim

    def inv_freq(self, device=None) -> torch.Tensor:
        """theta^(-2j/head_dim), j < head_dim/2, float32 (HF's default rope_type)."""
        j = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device)
        return (1.0 / self.rope_theta ** (j / self.head_dim)).float()


def hf_layer_shapes(cfg: LlamaLayerConfig) -> dict[str, tuple[int, ...]]:
    """The HF LlamaDecoderLayer (Qwen3DecoderLayer with qk_norm) weight names this layer
    reads, and their shapes."""
    shapes = {"input_layernorm.weight": (cfg.d,), "post_attention_layernorm.weight": (cfg.d,),
              "self_attn.q_proj.weight": (cfg.q_cols, cfg.d), "self_attn.k_proj.weight": (cfg.kv_cols, cfg.d),
              "self_attn.v_proj.weight": (cfg.kv_cols, cfg.d), "self_attn.o_proj.weight": (cfg.d, cfg.q_cols),
              "mlp.gate_proj.weight": (cfg.ffn, cfg.d), "mlp.up_proj.weight": (cfg.ffn, cfg.d),
              "mlp.down_proj.weight": (cfg.d, cfg.ffn)}
    if cfg.qk_norm:
        shapes |= {"self_attn.q_norm.weight": (cfg.head_dim,), "self_attn.k_norm.weight": (cfg.head_dim,)}
    return shapes


#: checkpoint entries that are no weights and are left out: older HF LLaMA checkpoints saved
#: each layer's RoPE frequencies (the layers here make theirs from the config)
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def check_hf_entries(sd: dict, shapes: dict[str, tuple[int, ...]], prefix: str = "") -> None:
    """One ValueError naming every missing, unexpected or wrongly shaped entry of sd (its keys
    shown with `prefix`) against {key: shape}; an entry is never broadcast into a weight."""
    problems = [f"missing {prefix}{k} {shape}" for k, shape in shapes.items() if k not in sd]
    problems += [f"{prefix}{k} is {tuple(sd[k].shape)}, want {shape}" for k, shape in shapes.items()
                 if k in sd and tuple(sd[k].shape) != shape]
    extra = sorted(k for k in sd if k not in shapes and not k.endswith(IGNORED_HF_SUFFIXES))
    problems += [f"unexpected {prefix}{k}" for k in extra]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise ValueError(f"the state dict does not fit: {shown}")


def hf_to_kernel_layout(sd: dict[str, torch.Tensor], cfg: LlamaLayerConfig, prefix: str = "") -> dict[str, torch.Tensor]:
    """One HF LlamaDecoderLayer state dict (self_attn.q_proj.weight, ..., mlp.gate_proj.weight,
    input_layernorm.weight, post_attention_layernorm.weight; a prefix such as
    "model.layers.0." stripped, and named by `prefix` in errors) -> this module's parameters
    (see the module docstring). Every entry must be there at its exact shape and no other
    (a Qwen3 checkpoint's q_norm into a layer without qk_norm, or a bias, is an error, not
    dropped); RoPE frequencies saved by older checkpoints are left out."""
    check_hf_entries(sd, hf_layer_shapes(cfg), prefix)
    pair = _rope_pairing(cfg.head_dim)
    q = _permute_heads(sd["self_attn.q_proj.weight"], pair, cfg.head_dim)
    k = _permute_heads(sd["self_attn.k_proj.weight"], pair, cfg.head_dim)
    gate, up = sd["mlp.gate_proj.weight"], sd["mlp.up_proj.weight"]
    params = {} if not cfg.qk_norm else {"q_norm": sd["self_attn.q_norm.weight"][pair.to(q.device)],
                                         "k_norm": sd["self_attn.k_norm.weight"][pair.to(q.device)]}
    return params | {
        "input_norm": sd["input_layernorm.weight"],
        "post_norm": sd["post_attention_layernorm.weight"],
        "w_qkv": torch.cat((q, k, sd["self_attn.v_proj.weight"])),
        "w_o": sd["self_attn.o_proj.weight"],
        "w_gu": torch.stack((gate, up), dim=1).reshape(2 * cfg.ffn, cfg.d),
        "w_down": sd["mlp.down_proj.weight"],
    }


def kernel_to_hf_layout(params: dict[str, torch.Tensor], cfg: LlamaLayerConfig) -> dict[str, torch.Tensor]:
    """The inverse of hf_to_kernel_layout (for saving a checkpoint HF code can read)."""
    unpair = torch.argsort(_rope_pairing(cfg.head_dim))
    q, k, v = params["w_qkv"].split((cfg.q_cols, cfg.kv_cols, cfg.kv_cols))
    qk_norm = {} if not cfg.qk_norm else {"self_attn.q_norm.weight": params["q_norm"][unpair.to(q.device)],
                                          "self_attn.k_norm.weight": params["k_norm"][unpair.to(q.device)]}
    return qk_norm | {
        "input_layernorm.weight": params["input_norm"],
        "post_attention_layernorm.weight": params["post_norm"],
        "self_attn.q_proj.weight": _permute_heads(q, unpair, cfg.head_dim),
        "self_attn.k_proj.weight": _permute_heads(k, unpair, cfg.head_dim),
        "self_attn.v_proj.weight": v,
        "self_attn.o_proj.weight": params["w_o"],
        "mlp.gate_proj.weight": params["w_gu"][0::2],
        "mlp.up_proj.weight": params["w_gu"][1::2],
        "mlp.down_proj.weight": params["w_down"],
    }


def _rope_pairing(head_dim: int) -> torch.Tensor:
    """Kernel row 2j <- HF row j, kernel row 2j+1 <- HF row j + head_dim/2."""
    half = torch.arange(head_dim // 2)
    return torch.stack((half, half + head_dim // 2), dim=1).reshape(-1)


def _permute_heads(w: torch.Tensor, order: torch.Tensor, head_dim: int) -> torch.Tensor:
    rows = w.reshape(-1, head_dim, w.shape[-1])
    return rows[:, order.to(w.device)].reshape(w.shape)


def require_bfloat16(module: torch.nn.Module) -> None:
    """A fused module's parameters must be bfloat16 (the expert kernels' operands; there is no
    autocast path): one clear error naming the module, not the first kernel's."""
    dtypes = {p.dtype for p in module.parameters()} - {torch.bfloat16}
    if dtypes:
        raise ValueError(f"{type(module).__name__}: its parameters are {', '.join(sorted(map(str, dtypes)))}; the fused "
                         "kernels take bfloat16 parameters (module.to(torch.bfloat16)); autocast does not change them")


class _LayerParams(torch.nn.Module):
    """The parameters both layers hold, in the kernels' layout."""

    def __init__(self, cfg: LlamaLayerConfig, dtype: torch.dtype, device=None):
        super().__init__()
        self.cfg = cfg
        shapes = {"input_norm": (cfg.d,), "post_norm": (cfg.d,), "w_qkv": (cfg.q_cols + 2 * cfg.kv_cols, cfg.d),
                  "w_o": (cfg.d, cfg.q_cols), "w_gu": (2 * cfg.ffn, cfg.d), "w_down": (cfg.d, cfg.ffn)}
        if cfg.qk_norm:
            shapes |= {"q_norm": (cfg.head_dim,), "k_norm": (cfg.head_dim,)}
        for name, shape in shapes.items():
            init = torch.ones(shape) if name.endswith("norm") else torch.randn(shape) / shape[-1] ** 0.5
            setattr(self, name, torch.nn.Parameter(init.to(device=device, dtype=dtype)))
        self.register_buffer("inv_freq", cfg.inv_freq(device), persistent=False)

    def _apply(self, fn, recurse=True):
        """.to(), .bfloat16(), .half(), .cuda() ...: RoPE's frequencies keep their float32
        values (a cast would round them: bf16's inv_freq turned the angles at position 256
        wrong by tenths of a radian), moved to the device the move chose; frequencies of one's
        own (a scaled RoPE set as inv_freq) stay. From the meta device (to_empty) they are made
        from the config."""
        before = self.inv_freq
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        self.inv_freq = self.cfg.inv_freq(device) if before.is_meta else before.to(device)
        return self

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """Copy an HF-named, HF-layout layer state dict in, converted once (module docstring);
        one that does not fit (hf_to_kernel_layout) changes nothing."""
        self.copy_params(hf_to_kernel_layout(sd, self.cfg))

    def copy_params(self, params: dict[str, torch.Tensor]) -> None:
        """Copy kernel-layout parameters in (hf_to_kernel_layout's, checked)."""
        with torch.no_grad():
            for name, t in params.items():
                getattr(self, name).copy_(t)

    def to_hf_state_dict(self) -> dict[str, torch.Tensor]:
        return kernel_to_hf_layout({n: p.detach() for n, p in self.named_parameters()}, self.cfg)

    def _batch_seq(self, x: torch.Tensor) -> tuple[int, int]:
        """x's (batch, seq), or one clear error where x is not (batch, seq, d)."""
        if x.dim() != 3 or x.shape[-1] != self.cfg.d:
            raise ValueError(f"{type(self).__name__}: x must be (batch, seq, {self.cfg.d}), got {tuple(x.shape)}")
        return x.shape[0], x.shape[1]

    def _positions(self, batch: int, seq: int, positions: torch.Tensor | None, device) -> torch.Tensor:
        """(batch * seq,) float32 positions from None (0 .. seq-1 in every sequence), (seq,) or
        (batch, seq), or one clear error. A position only turns RoPE's angle: sequences packed
        into one row still attend to each other (causal over the whole row, no document mask)."""
        if positions is None:
            positions = torch.arange(seq, device=device)
        if tuple(positions.shape) not in ((seq,), (1, seq), (batch, seq)):
            raise ValueError(f"{type(self).__name__}: positions must be ({seq},) or ({batch}, {seq}), "
                             f"got {tuple(positions.shape)}")
        return positions.expand(batch, seq).reshape(-1).float()

    def _attention(self, qkv: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        """Causal GQA attention on rows [q | k | v] -> (B*S, n_heads*head_dim)."""
        c = self.cfg
        q, k, v = (t.reshape(batch, seq, -1, c.head_dim).transpose(1, 2)
                   for t in qkv.split((c.q_cols, c.kv_cols, c.kv_cols), dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.n_kv_heads != c.n_heads)
        return out.transpose(1, 2).reshape(batch * seq, c.q_cols)


class FusedLlamaLayer(_LayerParams):
    """The decoder layer through the fused ops; bfloat16 parameters and activations (what the
    expert kernels take). forward(x (B, S, d), positions (S,) or (B, S) | None) -> (B, S, d).
    A layer on its own: the input RMSNorm's h = x * w and rstd are torch (in FusedLlamaModel,
    training/model.py, the previous layer's down projection writes them, k0), and the down
    projection + residual is an addmm.

    keep_act (an attribute, settable between steps; off by default): keep SwiGLU's forward
    output for the backward (M x F bf16 more memory until then), so the backward's
    down-projection dgrad stores no second copy (training/ops.py kept_act)."""

    def __init__(self, cfg: LlamaLayerConfig, device=None, keep_act: bool = False):
        if cfg.fused_kernel_problems():
            raise ValueError(f"FusedLlamaLayer: {'; '.join(cfg.fused_kernel_problems())} ({cfg})")
        super().__init__(cfg, torch.bfloat16, device)
        self.keep_act = keep_act

    def qk_norms(self) -> tuple:
        """(q_norm, k_norm) of a Qwen3 layer, (None, None) of a LLaMA one: the block ops'
        optional arguments, passed in their places either way."""
        return (self.q_norm, self.k_norm) if self.cfg.qk_norm else (None, None)

    def attention_input(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """rows (M, d) -> qkv (M, q + 2 kv columns): the input norm, QKV and RoPE (Qwen3: and the
        QK-norm), one op; positions (M,) float32."""
        rope = (positions, self.inv_freq, self.cfg.q_cols + self.cfg.kv_cols, self.cfg.eps)
        if self.cfg.qk_norm:
            return rmsnorm_qk_norm_rope(rows, self.input_norm, self.w_qkv, *self.qk_norms(), *rope)[0]
        return rmsnorm_qkv_rope(rows, self.input_norm, self.w_qkv, *rope)[0]

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        require_bfloat16(self)
        (batch, seq), d = self._batch_seq(x), self.cfg.d
        rows = x.reshape(batch * seq, d)
        qkv = self.attention_input(rows, self._positions(batch, seq, positions, x.device))
        attn = self._attention(qkv, batch, seq)
        y, *_ = attention_out_mlp(attn, rows, self.w_o, self.post_norm, self.w_gu, self.w_down, self.cfg.eps,
                                  self.keep_act)
        return y.reshape(batch, seq, d)


class ReferenceLlamaLayer(_LayerParams):
    """The same layer, same parameters and layout, as plain unfused torch in float32 (or the
    dtype given: bfloat16 gives the plain low-precision pipeline the kernels are judged
    against)."""

    def __init__(self, cfg: LlamaLayerConfig, dtype: torch.dtype = torch.float32, device=None):
        super().__init__(cfg, dtype, device)

    def _rmsnorm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.eps) * weight

    def _qk_norm(self, qk: torch.Tensor) -> torch.Tensor:
        """Qwen3's QK-norm: each q and k head RMSNorm'd with q_norm or k_norm."""
        c = self.cfg
        heads = qk.reshape(qk.shape[0], -1, c.head_dim)
        weight = torch.cat((self.q_norm.expand(c.n_heads, -1), self.k_norm.expand(c.n_kv_heads, -1)))
        return (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + QK_NORM_EPS) * weight).reshape(qk.shape)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        c = self.cfg
        (batch, seq), d = self._batch_seq(x), self.cfg.d
        rows = x.reshape(batch * seq, d)
        pos = self._positions(batch, seq, positions, x.device)
        qkv = self._rmsnorm(rows, self.input_norm) @ self.w_qkv.T
        if c.qk_norm:
            qkv = torch.cat((self._qk_norm(qkv[:, :c.q_cols + c.kv_cols]), qkv[:, c.q_cols + c.kv_cols:]), dim=1)
        qkv = rotate_adjacent_pairs(qkv, pos, self.inv_freq, c.q_cols + c.kv_cols)
        h = rows + self._attention(qkv, batch, seq) @ self.w_o.T
        z = self._rmsnorm(h, self.post_norm) @ self.w_gu.T
        y = h + (F.silu(z[:, 0::2]) * z[:, 1::2]) @ self.w_down.T
        return y.reshape(batch, seq, d)
