"""training/: the Qwen3 variant (LlamaLayerConfig(qk_norm=True)): the per-head QK-norm before
RoPE through the qkn expert kernel forward, torch then k6 backward, on the CPU through the
emulator; the layer against the unfused float32 reference layer (with the plain bf16
pipeline's error as the second bound, tests/training/test_training_layer.py's rule and tolerance), a
plain HF-style Qwen3 attention input, unfused float64 op math, opcheck and torch.compile; a
2-layer Qwen3 model against its float32 reference, its launches, its ops by opcheck.
Measured at head_dim 64 and 128 (these seeds): 0.31% (y) to 0.73% (dk_norm) fused, 0.49% to 1.39%
plain bf16.
"""

import math

import pytest
import torch
from training_checks import U, assert_near_float32, forward_backward, hf_layer_state_dict, hf_model_state_dict, rel

from epiforge.training.layer import FusedLlamaLayer, LlamaLayerConfig, ReferenceLlamaLayer
from epiforge.training.model import FusedLlamaModel, LlamaModelConfig, ReferenceLlamaModel
from epiforge.training.model_ops import decoder_block, embed_rmsnorm_qkv_rope
from epiforge.training.ops import QK_NORM_EPS, rmsnorm_qk_norm_rope, rotate_adjacent_pairs

#: a layer's bound (tests/training/test_training_layer.py) and a 2-layer model's (tests/training/test_training_model.py)
REL_TOL = 4 * U
MODEL_REL_TOL = 6 * U

#: Qwen3's settings (eps 1e-6, theta 1e6) at the layer test's CPU sizes
CPU_CONFIG = LlamaLayerConfig(d=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=768, eps=1e-6, rope_theta=1e6,
                              qk_norm=True)
CPU_BATCH, CPU_SEQ = 2, 48


@pytest.mark.parametrize("head_dim", [64, 128])
def test_qk_norm_layer_output_and_every_gradient_match_the_float32_reference(head_dim):
    cfg = LlamaLayerConfig(d=256, n_heads=256 // head_dim, n_kv_heads=128 // head_dim, head_dim=head_dim, ffn=768,
                           eps=1e-6, rope_theta=1e6, qk_norm=True)
    sd = hf_layer_state_dict(cfg)
    layers = FusedLlamaLayer(cfg), ReferenceLlamaLayer(cfg), ReferenceLlamaLayer(cfg, torch.bfloat16)
    for layer in layers:
        layer.load_hf_state_dict(sd)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(CPU_BATCH, CPU_SEQ, cfg.d, generator=g).bfloat16().float()
    dy = (1e-2 * torch.randn(CPU_BATCH, CPU_SEQ, cfg.d, generator=g)).bfloat16().float()
    got, want, plain = (forward_backward(m, x, dy, t) for m, t in zip(layers, (torch.bfloat16, torch.float32,
                                                                              torch.bfloat16)))
    assert {"dq_norm", "dk_norm"} <= want.keys()
    assert_near_float32(got, want, plain, REL_TOL)


def _hf_style_qkv(sd, cfg, x, positions):
    """Hugging Face's Qwen3 attention input, plainly in float32: RMSNorm, q/k/v projections,
    q_norm/k_norm over each head, rotate_half RoPE -> q, k, v as (B, heads, S, head_dim)."""
    def rmsnorm(t, w, eps):
        return w * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(t):
        half = t.shape[-1] // 2
        return torch.cat((-t[..., half:], t[..., :half]), dim=-1)

    b, s, _ = x.shape
    h = rmsnorm(x, sd["input_layernorm.weight"], cfg.eps)
    q = rmsnorm((h @ sd["self_attn.q_proj.weight"].T).view(b, s, cfg.n_heads, cfg.head_dim),
                sd["self_attn.q_norm.weight"], QK_NORM_EPS).transpose(1, 2)
    k = rmsnorm((h @ sd["self_attn.k_proj.weight"].T).view(b, s, cfg.n_kv_heads, cfg.head_dim),
                sd["self_attn.k_norm.weight"], QK_NORM_EPS).transpose(1, 2)
    v = (h @ sd["self_attn.v_proj.weight"].T).view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    freqs = positions[:, :, None].double() * cfg.inv_freq().double()[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float()[:, None], emb.sin().float()[:, None]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def test_hf_qwen3_weights_give_hf_attention_scores_and_round_trip():
    """The pairing permutation applied to q_norm and k_norm as to q_proj and k_proj rows:
    per head, q . k (what attention reads) equals HF's; v unchanged; to_hf_state_dict gives
    the weights back."""
    cfg = CPU_CONFIG
    sd = hf_layer_state_dict(cfg, seed=3)
    x = torch.randn(CPU_BATCH, CPU_SEQ, cfg.d, generator=torch.Generator().manual_seed(4)).bfloat16().float()
    positions = torch.arange(CPU_SEQ)[None, :] + torch.tensor([[0], [1000]])
    q_hf, k_hf, v_hf = _hf_style_qkv(sd, cfg, x, positions)
    rep = cfg.n_heads // cfg.n_kv_heads
    scores_hf = q_hf @ k_hf.repeat_interleave(rep, 1).transpose(-1, -2) / math.sqrt(cfg.head_dim)
    for layer, tol in ((ReferenceLlamaLayer(cfg), 1e-5), (FusedLlamaLayer(cfg), REL_TOL)):
        layer.load_hf_state_dict(sd)
        rows = x.to(layer.w_qkv.dtype).reshape(-1, cfg.d)
        pos = positions.reshape(-1).float()
        with torch.no_grad():
            if isinstance(layer, FusedLlamaLayer):
                qkv, _ = rmsnorm_qk_norm_rope(rows, layer.input_norm, layer.w_qkv, layer.q_norm, layer.k_norm, pos,
                                              layer.inv_freq, cfg.q_cols + cfg.kv_cols, cfg.eps)
            else:
                qkv = layer._rmsnorm(rows, layer.input_norm) @ layer.w_qkv.T
                qkv = torch.cat((layer._qk_norm(qkv[:, :cfg.q_cols + cfg.kv_cols]), qkv[:, cfg.q_cols + cfg.kv_cols:]), 1)
                qkv = rotate_adjacent_pairs(qkv, pos, layer.inv_freq, cfg.q_cols + cfg.kv_cols)
        q, k, v = (t.float().reshape(CPU_BATCH, CPU_SEQ, -1, cfg.head_dim).transpose(1, 2)
                   for t in qkv.split((cfg.q_cols, cfg.kv_cols, cfg.kv_cols), dim=-1))
        scores = q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / math.sqrt(cfg.head_dim)
        assert rel(scores, scores_hf) <= tol and rel(v, v_hf) <= tol, type(layer).__name__
        for name, t in layer.to_hf_state_dict().items():
            assert torch.equal(t.float(), sd[name]), name


def _op_args(cfg=CPU_CONFIG, m=96, seed=0):
    g = torch.Generator().manual_seed(seed)

    def bf16(*shape, scale=1.0, offset=0.0):
        return (offset + scale * torch.randn(*shape, generator=g)).bfloat16().requires_grad_()

    return (bf16(m, cfg.d), bf16(cfg.d, scale=0.1, offset=1.0), bf16(cfg.q_cols + 2 * cfg.kv_cols, cfg.d, scale=cfg.d**-0.5),
            bf16(cfg.head_dim, scale=0.1, offset=1.0), bf16(cfg.head_dim, scale=0.1, offset=1.0),
            (torch.arange(m) % 40).float(), cfg.inv_freq(), cfg.q_cols + cfg.kv_cols, cfg.eps)


def _unfused(x, norm_weight, w_qkv, q_norm, k_norm, positions, inv_freq, rotary_cols, eps):
    cfg = CPU_CONFIG
    z = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight @ w_qkv.T
    heads = z[:, :rotary_cols].reshape(z.shape[0], -1, cfg.head_dim)
    weight = torch.cat((q_norm.expand(cfg.n_heads, -1), k_norm.expand(cfg.n_kv_heads, -1)))
    qk = (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + QK_NORM_EPS) * weight).reshape(z.shape[0], -1)
    return rotate_adjacent_pairs(torch.cat((qk, z[:, rotary_cols:]), 1), positions, inv_freq, rotary_cols)


def test_the_op_and_its_gradients_match_unfused_float64_math():
    args = _op_args()
    leaves = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    ref_args = [a.detach().double().requires_grad_() if i in leaves else
                a.double() if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    got, want = rmsnorm_qk_norm_rope(*args)[0], _unfused(*ref_args)
    cotangent = (1e-2 * torch.randn(want.shape, generator=torch.Generator().manual_seed(5))).double()
    got.backward(cotangent.bfloat16())
    want.backward(cotangent)
    assert rel(got, want) <= REL_TOL
    for i in leaves:
        err = rel(args[i].grad, ref_args[i].grad)
        assert err <= REL_TOL, f"gradient of argument {i}: {err:.2e}"


def test_the_op_passes_torch_library_opcheck():
    result = torch.library.opcheck(rmsnorm_qk_norm_rope, _op_args(m=32), test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_the_qk_norm_layer_traces_whole_under_torch_compile_and_gives_the_eager_numbers():
    layer = FusedLlamaLayer(CPU_CONFIG)
    layer.load_hf_state_dict(hf_layer_state_dict(CPU_CONFIG))
    x = torch.randn(CPU_BATCH, CPU_SEQ, CPU_CONFIG.d, generator=torch.Generator().manual_seed(2)).bfloat16()

    def run(fn):
        layer.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        loss = fn(xg).float().pow(2).mean()
        loss.backward()
        return [loss.detach(), xg.grad, *(p.grad.clone() for p in layer.parameters())]

    compiled, eager = run(torch.compile(layer, fullgraph=True, backend="aot_eager")), run(layer)
    assert all(torch.equal(c, e) for c, e in zip(compiled, eager))


MODEL_CONFIG = LlamaModelConfig(vocab=520, n_layers=2, layer=CPU_CONFIG)
#: Qwen3's head layout: 128-wide heads, q wider than d (Qwen3-0.6B: d 1024, 16 q heads of 128)
WIDE_Q_CONFIG = LlamaModelConfig(vocab=520, n_layers=2, layer=LlamaLayerConfig(
    d=256, n_heads=4, n_kv_heads=2, head_dim=128, ffn=768, eps=1e-6, rope_theta=1e6, qk_norm=True))
#: the GPU shape: 2 layers of Qwen3-0.6B (d 1024, 16 heads of 128, 8 KV heads, F 3072), V 32768, 2 x 1024
GPU_MODEL_CONFIG = LlamaModelConfig(vocab=32768, n_layers=2, layer=LlamaLayerConfig(
    d=1024, n_heads=16, n_kv_heads=8, head_dim=128, ffn=3072, eps=1e-6, rope_theta=1e6, qk_norm=True))


def _against_float32_reference(cfg, batch, seq, device):
    sd = {k: v.to(device) for k, v in hf_model_state_dict(cfg).items()}
    models = FusedLlamaModel(cfg, device), ReferenceLlamaModel(cfg, device=device), \
        ReferenceLlamaModel(cfg, torch.bfloat16, device)
    stream = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(1)).to(device)
    results = []
    for model in models:
        model.load_hf_state_dict(sd)
        loss = model(stream[:, :-1], stream[:, 1:])
        loss.backward()
        results.append({"loss": loss.detach(), **{f"d{n}": p.grad for n, p in model.named_parameters()}})
    got, want, plain = results
    assert {"dlayers.0.q_norm", "dlayers.1.k_norm"} <= want.keys()
    assert_near_float32(got, want, plain, MODEL_REL_TOL)


@pytest.mark.parametrize("cfg", [MODEL_CONFIG, WIDE_Q_CONFIG], ids=["head64", "head128-q-wider-than-d"])
def test_a_qwen3_model_loss_and_every_gradient_match_the_float32_reference(cfg):
    """The fused model with qk_norm (qkn in the entry op and in decoder_block, the rest as in
    LLaMA's): its loss and every gradient, q_norm and k_norm included, within the model test's
    bound (6 u, tests/training/test_training_model.py) and 2x plain bf16's error. Measured (these seeds),
    head64: the gradients 0.44% (final_norm) to 1.06% (layers.1.k_norm) fused, 0.76% to 2.2%
    plain bf16; the loss 6.8e-5 fused, 1.4e-4 plain. head128 (q 512 wide, d 256): 0.46% to 1.05%
    fused, 0.69% to 1.56% plain; the loss 6.7e-5 fused, 1.4e-4 plain."""
    _against_float32_reference(cfg, CPU_BATCH, CPU_SEQ, "cpu")


@pytest.mark.gpu
def test_a_qwen3_model_loss_and_every_gradient_match_the_float32_reference_on_the_gpu():
    _against_float32_reference(GPU_MODEL_CONFIG, 2, 1024, "cuda")


def test_the_qwen3_model_runs_qkn_where_llama_runs_k4hf():
    from epiforge.primitives import trace

    model = FusedLlamaModel(MODEL_CONFIG)
    stream = torch.randint(0, MODEL_CONFIG.vocab, (1, 17), generator=torch.Generator().manual_seed(2))
    with trace.recording() as forward:
        model(stream[:, :-1], stream[:, 1:])
    epilogues = [c.split(":")[1].split("@")[0] for c in forward if c.startswith("gemm:")]
    assert epilogues == ["qk_norm_rope_64", "rms_partial_epi", "rmsnorm_swiglu", "rms_partial_epi", "qk_norm_rope_64",
                         "rms_partial_epi", "rmsnorm_swiglu", "rms_partial_epi", "rmsnorm_cross_entropy_logits"]


@pytest.mark.parametrize("which", ["embed_rmsnorm_qkv_rope", "decoder_block"])
def test_the_model_ops_with_qk_norm_pass_torch_library_opcheck(which):
    c, m = CPU_CONFIG, 32
    g = torch.Generator().manual_seed(0)

    def bf16(*shape, scale=1.0, offset=0.0):
        return (offset + scale * torch.randn(*shape, generator=g)).bfloat16().requires_grad_()

    qkv = (bf16(c.d, scale=0.1, offset=1.0), bf16(c.q_cols + 2 * c.kv_cols, c.d, scale=c.d**-0.5),
           (torch.arange(m) % 40).float(), c.inv_freq(), c.q_cols + c.kv_cols, c.eps)
    qk_norms = (bf16(c.head_dim, scale=0.1, offset=1.0), bf16(c.head_dim, scale=0.1, offset=1.0))
    if which == "embed_rmsnorm_qkv_rope":
        op, args = embed_rmsnorm_qkv_rope, (torch.randint(0, 64, (m,), generator=g), bf16(64, c.d), *qkv, *qk_norms)
    else:
        op, args = decoder_block, (bf16(m, c.q_cols), bf16(m, c.d), bf16(c.d, c.q_cols, scale=c.q_cols**-0.5),
                                   bf16(c.d, scale=0.1, offset=1.0), bf16(2 * c.ffn, c.d, scale=c.d**-0.5),
                                   bf16(c.d, c.ffn, scale=c.ffn**-0.5), *qkv, *qk_norms)
    result = torch.library.opcheck(op, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(v == "SUCCESS" for v in result.values()), result
