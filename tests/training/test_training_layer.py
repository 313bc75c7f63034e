"""training/layer.py: the fused LLaMA-3 decoder layer (k4hf, k0, k2 forward; k7, k6
backward; torch attention) against its unfused float32 reference and against a plain
Hugging Face style float32 layer written here, on the CPU through the emulator; its ops by
torch.library.opcheck; the layer under torch.compile(fullgraph=True); and on an H200.

Tolerance, from the bf16 arithmetic: every stored bf16 intermediate is off by at most the
unit roundoff u = 2^-8 of itself, and the longest chain (a QKV weight gradient: dy, k7's
dz, k6's dx, the attention backward, RoPE backward, k6's recomputed h) rounds about eight
times. Independent roundings add in quadrature, so a tensor's error relative to its norm,
||got - ref|| / ||ref||, should stay near sqrt(8) u ~ 2.8 u; the bound is 4 u = 2^-6. And,
CODA's rule on norms: no more than twice the plain bf16 PyTorch pipeline's own error (the
same reference layer run in bf16). Measured on the CPU shape below (these seeds): 0.31% (y)
to 0.62% (dw_qkv) fused, 0.49% (y) to 1.02% (dinput_norm) for plain bf16.
"""

import pytest
import torch
from training_checks import U, assert_near_float32, forward_backward, hf_layer_state_dict, hf_style_layer, rel

from epiforge.training.layer import FusedLlamaLayer, LlamaLayerConfig, ReferenceLlamaLayer
from epiforge.training.ops import attention_out_mlp, rmsnorm_qkv_rope, rotate_adjacent_pairs

#: ||got - ref|| / ||ref|| for the output and every gradient: 4 bf16 unit roundoffs (and at
#: most training_checks.TIMES_PLAIN_BF16 times the plain bf16 pipeline's error)
REL_TOL = 4 * U

#: the CPU shape: heads-64 of tasks/shapes.toml (d 256, head_dim 64, F 768) with GQA, M = 96
#: rows (not a multiple of the 128-row tile: a ragged last tile)
CPU_CONFIG = LlamaLayerConfig(d=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=768)
CPU_BATCH, CPU_SEQ = 2, 48
#: the GPU shape: LLaMA-3.2-1B's layer (d 2048, 32 heads of 64, 8 KV heads, F 8192), 2 x 1024
GPU_CONFIG = LlamaLayerConfig(d=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192)
GPU_BATCH, GPU_SEQ = 2, 1024


def _layers(cfg, device, seed=0, keep_act=False):
    sd = hf_layer_state_dict(cfg, seed)
    layers = FusedLlamaLayer(cfg, device, keep_act), ReferenceLlamaLayer(cfg, device=device), \
        ReferenceLlamaLayer(cfg, torch.bfloat16, device)
    for layer in layers:
        layer.load_hf_state_dict(sd)
    return layers


def _against_float32_reference(cfg, batch, seq, device, keep_act=False):
    fused, ref, plain_bf16 = _layers(cfg, device, keep_act=keep_act)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, seq, cfg.d, generator=g).bfloat16().float().to(device)
    dy = (1e-2 * torch.randn(batch, seq, cfg.d, generator=g)).bfloat16().float().to(device)
    got = forward_backward(fused, x, dy, torch.bfloat16)
    want = forward_backward(ref, x, dy, torch.float32)
    plain = forward_backward(plain_bf16, x, dy, torch.bfloat16)
    assert_near_float32(got, want, plain, REL_TOL)


@pytest.mark.parametrize("keep_act", [False, True], ids=["act-recomputed", "act-kept"])
def test_output_and_every_gradient_match_the_float32_reference_on_the_cpu(keep_act):
    """keep_act: the backward's down-projection dgrad is k7's epilogue without its act store,
    and dw_down comes from the forward's SwiGLU output."""
    _against_float32_reference(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu", keep_act)


@pytest.mark.parametrize("cfg", [CPU_CONFIG, LlamaLayerConfig(d=256, n_heads=4, n_kv_heads=4, head_dim=64, ffn=768),
                                 LlamaLayerConfig(d=256, n_heads=2, n_kv_heads=1, head_dim=128, ffn=768)],
                         ids=["gqa-head64", "mha-head64", "gqa-head128"])
def test_hf_weights_load_into_both_layers_and_match_a_plain_hf_style_layer(cfg):
    """The gate/up interleave and the RoPE pairing permutation, applied at load time, give
    Hugging Face's layer: the float32 reference to float32 roundoff, the fused one within the
    bf16 bound; given positions (B, S) are honoured; to_hf_state_dict gives the weights back."""
    sd = hf_layer_state_dict(cfg, seed=3)
    fused, ref = FusedLlamaLayer(cfg), ReferenceLlamaLayer(cfg)
    fused.load_hf_state_dict(sd)
    ref.load_hf_state_dict(sd)
    x = torch.randn(CPU_BATCH, CPU_SEQ, cfg.d, generator=torch.Generator().manual_seed(4)).bfloat16().float()
    positions = torch.arange(CPU_SEQ)[None, :] + torch.tensor([[0], [1000]])  # a second sequence further on
    want = hf_style_layer(sd, cfg, x, positions)
    with torch.no_grad():
        assert rel(ref(x, positions), want) < 1e-5
        assert rel(fused(x.bfloat16(), positions), want) <= REL_TOL
    for name, t in fused.to_hf_state_dict().items():
        assert torch.equal(t.float(), sd[name]), name


def _op_inputs(cfg=CPU_CONFIG, m=64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def bf16(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).bfloat16().requires_grad_()

    qkv_rows = cfg.q_cols + 2 * cfg.kv_cols
    qkv_args = (bf16(m, cfg.d), (1 + 0.1 * torch.randn(cfg.d, generator=g)).bfloat16().requires_grad_(),
                bf16(qkv_rows, cfg.d, scale=cfg.d**-0.5), (torch.arange(m) % 40).float(), cfg.inv_freq(),
                cfg.q_cols + cfg.kv_cols, cfg.eps)
    mlp_args = (bf16(m, cfg.q_cols), bf16(m, cfg.d), bf16(cfg.d, cfg.q_cols, scale=cfg.q_cols**-0.5),
                (1 + 0.1 * torch.randn(cfg.d, generator=g)).bfloat16().requires_grad_(),
                bf16(2 * cfg.ffn, cfg.d, scale=cfg.d**-0.5), bf16(cfg.d, cfg.ffn, scale=cfg.ffn**-0.5), cfg.eps)
    return qkv_args, mlp_args


def _unfused_qkv_rope(x, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    return rotate_adjacent_pairs(h @ w_qkv.T, positions, inv_freq, rotary_cols)


def _unfused_attention_out_mlp(attn, residual, w_o, norm_weight, w_gu, w_down, eps):
    x = attn @ w_o.T + residual
    z = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight @ w_gu.T
    return x + (torch.nn.functional.silu(z[:, 0::2]) * z[:, 1::2]) @ w_down.T, x


OPS = ["rmsnorm_qkv_rope", "attention_out_mlp", "attention_out_mlp-kept-act"]


def _op(which, qkv_args, mlp_args):
    """(op, its arguments) of an OPS entry; -kept-act: keep_act on."""
    if which == "rmsnorm_qkv_rope":
        return rmsnorm_qkv_rope, qkv_args
    return attention_out_mlp, (*mlp_args, which.endswith("kept-act"))


@pytest.mark.parametrize("which", OPS)
def test_each_op_and_its_gradients_match_unfused_float64_math(which):
    """Op by op, with a loss on every differentiable output (attention_out_mlp's x as well as
    y: the gradient arriving at x joins k6's residual input)."""
    op, args = _op(which, *_op_inputs(m=96))
    if which == "rmsnorm_qkv_rope":
        fused, unfused = lambda *a: rmsnorm_qkv_rope(*a)[:1], lambda *a: (_unfused_qkv_rope(*a),)
    else:
        fused, unfused = lambda *a: attention_out_mlp(*a)[:2], lambda *a: _unfused_attention_out_mlp(*a[:7])
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    ref_args = [a.detach().double().requires_grad_() if i in tensors else
                a.double() if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    g = torch.Generator().manual_seed(5)
    got, want = fused(*args), unfused(*ref_args)
    cotangents = [(1e-2 * torch.randn(w.shape, generator=g)).double() for w in want]
    torch.autograd.backward(got, [c.bfloat16() for c in cotangents])
    torch.autograd.backward(want, cotangents)
    for i, (o, w) in enumerate(zip(got, want)):
        assert rel(o, w) <= REL_TOL, f"output {i}: {rel(o, w):.2e}"
    for i in tensors:
        assert rel(args[i].grad, ref_args[i].grad) <= REL_TOL, f"gradient of argument {i}: {rel(args[i].grad, ref_args[i].grad):.2e}"


@pytest.mark.parametrize("which", OPS)
def test_each_op_passes_torch_library_opcheck(which):
    """Its schema, autograd registration and fake (meta) implementation, as torch checks them."""
    op, args = _op(which, *_op_inputs())
    result = torch.library.opcheck(op, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("keep_act", [False, True], ids=["act-recomputed", "act-kept"])
def test_the_layer_traces_whole_under_torch_compile_and_gives_the_eager_numbers(keep_act):
    fused = _layers(CPU_CONFIG, "cpu", keep_act=keep_act)[0]
    x = torch.randn(CPU_BATCH, CPU_SEQ, CPU_CONFIG.d, generator=torch.Generator().manual_seed(2)).bfloat16()

    def step(x):
        return fused(x).float().pow(2).mean()

    def run(fn):
        fused.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_()
        loss = fn(xg)
        loss.backward()
        return loss.detach(), xg.grad, [p.grad.clone() for p in fused.parameters()]

    compiled, eager = run(torch.compile(step, fullgraph=True, backend="aot_eager")), run(step)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    assert all(torch.equal(c, e) for c, e in zip(compiled[2], eager[2]))


def test_the_rope_backward_is_the_inverse_rotation():
    """The QKV backward's RoPE step as training/ops.py calls it (P.finish.rope_backward, the
    forward's sign +1, Hugging Face's): dz is dqkv rotated back, (x, y) -> (x cos t + y sin t,
    -x sin t + y cos t) per pair at t = position * inv_freq, written here in float64 from
    scratch, up to the one bf16 rounding and the float32 angle (its rounding, |t| 2^-24, moves
    a pair by that times its length; positions up to 8191); v's columns pass through bit for
    bit; ZdZ is the row sum of qkv * dqkv."""
    from epiforge import primitives as P

    g = torch.Generator().manual_seed(5)
    m, head_dim, rot_heads, v_heads = 7, 8, 3, 1
    cols = rot_heads * head_dim
    positions = torch.tensor([0, 1, 17, 255, 1023, 4095, 8191], dtype=torch.float32)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    dqkv = torch.randn(m, cols + v_heads * head_dim, generator=g).bfloat16()
    qkv = torch.randn(m, cols + v_heads * head_dim, generator=g).bfloat16()
    dz, zdz = P.finish.rope_backward(dqkv, qkv, positions, inv_freq, cols, 1)
    t = positions.double()[:, None, None] * inv_freq.double()[None, None, :]
    pairs = dqkv[:, :cols].double().reshape(m, rot_heads, head_dim // 2, 2)
    x, y = pairs[..., 0], pairs[..., 1]
    want = torch.stack((x * t.cos() + y * t.sin(), -x * t.sin() + y * t.cos()), -1).reshape(m, cols)
    angle_error = (t.abs() * 2.0 ** -23 + 1e-6) * pairs.norm(dim=-1)  # the float32 angle and trig
    bound = 2.0 ** -8 * want.abs() + angle_error.repeat_interleave(2, dim=-1).reshape(m, cols)
    assert dz.dtype == torch.bfloat16 and dz.shape == dqkv.shape and dz.is_contiguous()
    assert ((dz[:, :cols].double() - want).abs() <= bound).all()
    assert torch.equal(dz[:, cols:], dqkv[:, cols:])
    assert torch.allclose(zdz.double(), (qkv.double() * dqkv.double()).sum(-1), rtol=1e-5, atol=1e-5)


def test_operands_that_do_not_fit_are_one_line():
    qkv_args, mlp_args = _op_inputs(m=32)
    with pytest.raises(ValueError, match="do not fit"):
        rmsnorm_qkv_rope(qkv_args[0], qkv_args[1], qkv_args[2][:, :-8], *qkv_args[3:])
    with pytest.raises(ValueError, match="do not fit"):
        attention_out_mlp(*mlp_args[:5], mlp_args[5][:, :-8], mlp_args[6])
    with pytest.raises(ValueError, match="bfloat16"):
        attention_out_mlp(*(t.float() for t in mlp_args[:6]), mlp_args[6])
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        LlamaLayerConfig(d=256, n_heads=4, n_kv_heads=3, head_dim=64, ffn=768)


@pytest.mark.gpu
@pytest.mark.parametrize("keep_act", [False, True], ids=["act-recomputed", "act-kept"])
def test_output_and_every_gradient_match_the_float32_reference_on_the_gpu(keep_act):
    _against_float32_reference(GPU_CONFIG, GPU_BATCH, GPU_SEQ, "cuda", keep_act)


def test_the_kept_act_backward_gives_the_swiglu_gradient_and_passes_the_kept_act_on():
    """training/ops.py swiglu_backward_kernels with a kept act (keep_act's backward): dz, the
    SwiGLU backward of dy @ w_down at the packed (gate, up) pairs of z, rounded once to bf16,
    and the ZdZ row sums z . dz, both against float64 math written here; the act it returns
    is the kept one, not a recomputed one. Without a kept act (k7) the same dz and ZdZ, and
    the act recomputed as silu(gate) * up. Ragged sizes (neither M nor F a tile multiple)."""
    from epiforge.training.ops import swiglu_backward_kernels

    g = torch.Generator().manual_seed(7)
    m, d, f = 96, 64, 200
    dy = torch.randn(m, d, generator=g).bfloat16()
    w_down = (torch.randn(d, f, generator=g) / f**0.5).bfloat16()
    z = torch.randn(m, 2 * f, generator=g).bfloat16()
    kept = torch.randn(m, f, generator=g).bfloat16()
    gate, up, grad = z.double()[:, 0::2], z.double()[:, 1::2], dy.double() @ w_down.double()
    s = torch.sigmoid(gate)
    want = torch.stack((grad * up * s * (1 + gate * (1 - s)), grad * gate * s), -1).reshape(m, 2 * f)
    want_zdz = (z.double() * want).sum(-1)
    for act in (kept, kept.new_empty(0)):
        dz, zdz, out = swiglu_backward_kernels(dy, w_down, z, act)
        assert dz.dtype == torch.bfloat16 and dz.shape == (m, 2 * f)
        # one bf16 rounding of a float32 result: half a unit in the last place, and float32's own
        assert ((dz.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()
        assert torch.allclose(zdz.double(), want_zdz, rtol=1e-4, atol=1e-4)
        if act.numel():
            assert out is kept
        else:
            assert ((out.double() - gate * s * up).abs() <= 2.0 ** -8 * (gate * s * up).abs() + 1e-6).all()


def test_a_dtype_cast_leaves_the_rope_frequencies_float32():
    """.to(torch.bfloat16) (a habit: the layer is bf16 already) casts floating buffers too;
    RoPE's inv_freq must not be rounded by it, or positions far along rotate by wrong angles.
    The layer after the cast gives the same output, bit for bit, at positions up to 4095."""
    fused = _layers(CPU_CONFIG, "cpu")[0]
    x = torch.randn(1, CPU_SEQ, CPU_CONFIG.d, generator=torch.Generator().manual_seed(6)).bfloat16()
    positions = torch.arange(CPU_SEQ) * 87  # up to 4089
    with torch.no_grad():
        before = fused(x, positions)
        for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.float().bfloat16(), lambda m: m.half().bfloat16()):
            cast(fused)
            assert fused.inv_freq.dtype == torch.float32
            assert torch.equal(fused(x, positions), before)
    # frequencies of one's own (a scaled RoPE) survive a move; a model made on the meta device
    # gets the config's when it is given memory
    scaled = fused.inv_freq / 8
    fused.inv_freq = scaled
    assert torch.equal(fused.to("cpu", torch.bfloat16).inv_freq, scaled)
    meta = FusedLlamaLayer(CPU_CONFIG, device="meta").to_empty(device="cpu")
    assert torch.equal(meta.inv_freq, CPU_CONFIG.inv_freq())
