"""What the training tests share (tests/training/test_training_layer.py, _model.py, _qk_norm.py): the
rule a fused layer or model is held to against its unfused float32 reference, and random
weights in Hugging Face's layout with a plain float32 HF-style layer to load them into.

The rule: a tensor's error relative to its norm, ||got - ref|| / ||ref||, within a bound
counted in bf16 unit roundoffs (each test file derives its own from its longest rounding
chain), and no more than TIMES_PLAIN_BF16 times the plain bf16 PyTorch pipeline's error (the
same reference run in bf16: CODA's rule, on norms)."""

import math

import torch

#: the bf16 unit roundoff
U = 2.0**-8
#: the fused error may be at most this many times the plain bf16 pipeline's
TIMES_PLAIN_BF16 = 2.0


def rel(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def forward_backward(layer, x, dy, dtype) -> dict:
    """A layer's output and the gradients of its input and every parameter, for y.backward(dy)."""
    x = x.to(dtype).detach().requires_grad_()
    y = layer(x)
    y.backward(dy.to(dtype))
    return {"y": y.detach(), "dx": x.grad, **{f"d{n}": p.grad for n, p in layer.named_parameters()}}


def assert_near_float32(got: dict, want: dict, plain: dict, rel_tol: float) -> None:
    """Every tensor of `want` (the float32 reference's): the fused one within rel_tol of it,
    and within TIMES_PLAIN_BF16 of the plain bf16 pipeline's error; the errors are printed."""
    errors = {name: (rel(got[name], want[name]), rel(plain[name], want[name])) for name in want}
    width = max(map(len, errors), default=0)
    print("\n".join(f"{n:{width}s} fused {e:.2e}  plain bf16 {p:.2e}" for n, (e, p) in errors.items()))
    for name, (err, plain_err) in errors.items():
        assert err <= rel_tol, f"{name}: {err:.2e} of its norm off float32 (bound {rel_tol:.2e})"
        assert err <= TIMES_PLAIN_BF16 * plain_err, \
            f"{name}: {err:.2e}, over {TIMES_PLAIN_BF16} x plain bf16's {plain_err:.2e}"


def hf_layer_state_dict(cfg, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF LlamaDecoderLayer (Qwen3DecoderLayer with cfg.qk_norm) state dict, float32
    holding bf16 values (so the bf16 and float32 layers hold the same numbers): linear
    weights ~ N(0, 1/in), norms ~ 1 +- 0.1."""
    g = torch.Generator().manual_seed(seed)

    def linear(n_out, n_in):
        return (torch.randn(n_out, n_in, generator=g) / n_in**0.5).bfloat16().float()

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=g)).bfloat16().float()

    sd = {"input_layernorm.weight": norm(cfg.d), "self_attn.q_proj.weight": linear(cfg.q_cols, cfg.d),
          "self_attn.k_proj.weight": linear(cfg.kv_cols, cfg.d), "self_attn.v_proj.weight": linear(cfg.kv_cols, cfg.d)}
    if cfg.qk_norm:
        sd |= {"self_attn.q_norm.weight": norm(cfg.head_dim), "self_attn.k_norm.weight": norm(cfg.head_dim)}
    return sd | {"self_attn.o_proj.weight": linear(cfg.d, cfg.q_cols), "post_attention_layernorm.weight": norm(cfg.d),
                 "mlp.gate_proj.weight": linear(cfg.ffn, cfg.d), "mlp.up_proj.weight": linear(cfg.ffn, cfg.d),
                 "mlp.down_proj.weight": linear(cfg.d, cfg.ffn)}


def hf_model_state_dict(cfg, seed: int = 0, tied: bool = False) -> dict[str, torch.Tensor]:
    """A random HF LlamaForCausalLM (Qwen3ForCausalLM) state dict, float32 holding bf16
    values; `tied`: no lm_head (it is the embedding)."""
    g = torch.Generator().manual_seed(seed)
    d = cfg.layer.d
    sd = {"model.embed_tokens.weight": torch.randn(cfg.vocab, d, generator=g).bfloat16().float(),
          "model.norm.weight": (1 + 0.1 * torch.randn(d, generator=g)).bfloat16().float()}
    if not tied:
        sd["lm_head.weight"] = (torch.randn(cfg.vocab, d, generator=g) / d**0.5).bfloat16().float()
    for i in range(cfg.n_layers):
        sd.update({f"model.layers.{i}.{k}": v for k, v in hf_layer_state_dict(cfg.layer, seed + 1 + i).items()})
    return sd


def hf_style_layer(sd, cfg, x, position_ids):
    """Hugging Face's LlamaDecoderLayer, rewritten plainly in float32: rotate_half RoPE
    (column j with j + head_dim/2), repeat_kv, an explicit causal softmax, separate
    gate/up projections."""
    def rmsnorm(t, w):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.eps))

    def rotate_half(t):
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

    b, s, _ = x.shape
    h = rmsnorm(x, sd["input_layernorm.weight"])
    q, k, v = (h @ sd[f"self_attn.{n}_proj.weight"].T for n in "qkv")
    q = q.view(b, s, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    k = k.view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    v = v.view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    freqs = position_ids[:, :, None].double() * cfg.inv_freq().double()[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float()[:, None], emb.sin().float()[:, None]
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    rep = cfg.n_heads // cfg.n_kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, cfg.q_cols)
    x = x + attn @ sd["self_attn.o_proj.weight"].T
    h = rmsnorm(x, sd["post_attention_layernorm.weight"])
    gate, up = h @ sd["mlp.gate_proj.weight"].T, h @ sd["mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(gate) * up) @ sd["mlp.down_proj.weight"].T
