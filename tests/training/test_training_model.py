"""training/model.py: the fused LLaMA-3 language model (the block re-cut across layer
boundaries: k0 hands the next layer's h and rstd to its k4hf; k5 for the LM head and loss;
k6 for every norm's backward, fed the real residual gradient) against its unfused float32
reference, on the CPU through the emulator; its ops against unfused float64 math and by
torch.library.opcheck; HF LlamaForCausalLM weights against a plain HF-style float32 model;
torch.compile(fullgraph=True) against eager; and on an H200.

Tolerance, from the bf16 arithmetic as in tests/training/test_training_layer.py: a stored bf16
intermediate is off by at most u = 2^-8 of itself; the longest chain here (the embedding's
gradient: dlogits, the LM head's k6, then per layer k7's dz, k6's dx, the attention
backward, the RoPE backward and the input norm's k6, then the index_add) rounds about 16
times in a 2-layer model and 22 in a 3-layer one, so in quadrature ||got - ref|| / ||ref||
should stay near sqrt(16..22) u = 4..4.7 u; the bound is 6 u. And no more than twice the
plain bf16 PyTorch pipeline's error (the same reference model run in bf16, its logits upcast
for the loss). Measured on the CPU shape below (these seeds), 2 layers: loss 5.7e-5 fused,
5.2e-5 plain bf16; the gradients 0.40% (final_norm) to 0.82% (layers.1.w_qkv) fused, 0.66%
to 1.36% plain. 3 layers: loss 2.5e-5 fused, 9.4e-5 plain; gradients 0.49% to 0.94%
(layers.2.w_qkv) fused, 0.77% to 1.72% plain. 2 layers with the logits stored (k5l, the
backward from the bf16 logits): loss 5.7e-5, gradients 0.40% to 0.81%, as with them recomputed.
"""

import pytest
import torch
import torch.nn.functional as F
from training_checks import U, assert_near_float32, hf_model_state_dict, hf_style_layer, rel

from epiforge.training.layer import LlamaLayerConfig
from epiforge.training.model import FusedLlamaModel, LlamaModelConfig, ReferenceLlamaModel
from epiforge.training.model_ops import decoder_block, decoder_block_logits, decoder_block_loss, embed_rmsnorm_qkv_rope
from epiforge.training.ops import rotate_adjacent_pairs

#: ||got - ref|| / ||ref|| for the loss and every gradient: 6 bf16 unit roundoffs (and at
#: most training_checks.TIMES_PLAIN_BF16 times the plain bf16 pipeline's error)
REL_TOL = 6 * U

#: the CPU shape: the layer test's (d 256, GQA 4/2 heads of 64, F 768), 2 layers, a vocabulary
#: of 520 (a multiple of 8 as the GPU needs, not of the LM head's column tile), 2 x 48 rows (a ragged row tile)
CPU_CONFIG = LlamaModelConfig(vocab=520, n_layers=2,
                              layer=LlamaLayerConfig(d=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=768))
CPU_BATCH, CPU_SEQ = 2, 48
#: the GPU shape: 2 layers of LLaMA-3.2-1B (d 2048, 32 heads of 64, 8 KV heads, F 8192), a
#: vocabulary of 32768 (the k5 task's; LLaMA-3's 128256 would quadruple the reference's
#: float32 logits), 2 x 1024 tokens
GPU_CONFIG = LlamaModelConfig(vocab=32768, n_layers=2,
                              layer=LlamaLayerConfig(d=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192))
GPU_BATCH, GPU_SEQ = 2, 1024


def _models(cfg, device, seed=0, store_logits=False, keep_act=False):
    sd = hf_model_state_dict(cfg, seed)
    models = FusedLlamaModel(cfg, device, store_logits, keep_act=keep_act), ReferenceLlamaModel(cfg, device=device), \
        ReferenceLlamaModel(cfg, torch.bfloat16, device)
    for model in models:
        model.load_hf_state_dict(sd)
    return models


def _tokens(cfg, batch, seq, device, seed=1):
    """Random tokens and next tokens: inputs (B, S) and targets (B, S)."""
    stream = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))
    return stream[:, :-1].to(device), stream[:, 1:].to(device)


def _loss_and_gradients(model, tokens, targets):
    model.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    return {"loss": loss.detach(), **{f"d{n}": p.grad for n, p in model.named_parameters()}}


def _padded(targets, every=5):
    """targets with every `every`-th row (and the last sequence's last eight) set to -100,
    the ignore_index of torch's and Hugging Face's losses: padding."""
    targets = targets.clone()
    targets.view(-1)[::every] = -100
    targets[-1, -8:] = -100
    return targets


def _against_float32_reference(cfg, batch, seq, device, store_logits=False, padded=False, keep_act=False):
    fused, ref, plain_bf16 = _models(cfg, device, store_logits=store_logits, keep_act=keep_act)
    tokens, targets = _tokens(cfg, batch, seq, device)
    if padded:
        targets = _padded(targets)
    got, want, plain = (_loss_and_gradients(m, tokens, targets) for m in (fused, ref, plain_bf16))
    assert_near_float32(got, want, plain, REL_TOL)


@pytest.mark.parametrize("n_layers, store_logits, keep_act", [(2, False, False), (3, False, False), (2, True, False),
                                                               (3, True, True)],
                         ids=["2-layers", "3-layers", "2-layers-stored-logits", "3-layers-stored-logits-kept-act"])
def test_loss_and_every_gradient_match_the_float32_reference_on_the_cpu(n_layers, store_logits, keep_act):
    """3 layers: a decoder_block's residual cotangent then comes from another decoder_block.
    Stored logits: the LM head is k5l and its backward reads the bf16 logits it kept. Kept
    act: every layer's backward takes SwiGLU's output from its forward (keep_act)."""
    _against_float32_reference(LlamaModelConfig(CPU_CONFIG.vocab, n_layers, CPU_CONFIG.layer), CPU_BATCH, CPU_SEQ, "cpu",
                               store_logits, keep_act=keep_act)


@pytest.mark.parametrize("store_logits", [False, True], ids=["recomputed-logits", "stored-logits"])
def test_a_confident_model_gets_its_gradient_as_closely_as_the_plain_bf16_pipeline(store_logits):
    """An LM head ten times larger (logits up to ~40) and the targets the float32 model
    predicts (their argmax): a confident model, whose target columns' gradients p_t - 1 are
    near 0. Every gradient within TIMES_PLAIN_BF16 of the plain bf16 pipeline's error (the
    worst up to 5 % of its norm fused and 8 % plain, beyond the 6 u random weights allow).
    With stored logits the softmax once took the forward's lse, of the logits before their
    bf16 rounding: the target gradients came out as large as that rounding, and dembed was
    0.141 of its norm off float32 here."""
    sd = hf_model_state_dict(CPU_CONFIG, seed=0)
    sd["lm_head.weight"] = (10 * sd["lm_head.weight"]).bfloat16().float()
    fused, ref, plain_bf16 = FusedLlamaModel(CPU_CONFIG, store_logits=store_logits), ReferenceLlamaModel(CPU_CONFIG), \
        ReferenceLlamaModel(CPU_CONFIG, torch.bfloat16)
    for model in (fused, ref, plain_bf16):
        model.load_hf_state_dict(sd)
    tokens, _ = _tokens(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu")
    with torch.no_grad():
        x = ref.embed[tokens]
        for layer in ref.layers:
            x = layer(x)
        logits = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CPU_CONFIG.layer.eps) * ref.final_norm) @ ref.lm_head.T
    targets = logits.argmax(-1)
    got, want, plain = (_loss_and_gradients(m, tokens, targets) for m in (fused, ref, plain_bf16))
    assert logits.abs().max() > 30 and want["loss"] < 0.5
    assert_near_float32(got, want, plain, rel_tol=0.1)


def _logits_against_float32_reference(cfg, batch, seq, device, keep_act=False):
    """forward without targets: the logits (B, S, V) in bf16, and under a loss of one's own
    (each logit weighted at random) every parameter's gradient through them, within the same
    bounds as the cross-entropy's; under no_grad the same logits."""
    fused, ref, plain_bf16 = _models(cfg, device, keep_act=keep_act)
    tokens, _ = _tokens(cfg, batch, seq, device)
    weights = 1e-2 * torch.randn(batch, seq, cfg.vocab, generator=torch.Generator().manual_seed(8)).to(device)

    def logits_and_gradients(model):
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        (logits.float() * weights).sum().backward()
        return {"logits": logits.detach(), **{f"d{n}": p.grad for n, p in model.named_parameters()}}

    got, want, plain = (logits_and_gradients(m) for m in (fused, ref, plain_bf16))
    assert got["logits"].shape == (batch, seq, cfg.vocab) and got["logits"].dtype == torch.bfloat16
    assert_near_float32(got, want, plain, REL_TOL)
    with torch.no_grad():
        assert torch.equal(fused(tokens), got["logits"])


@pytest.mark.parametrize("keep_act", [False, True], ids=["act-recomputed", "act-kept"])
def test_the_logits_and_their_gradients_match_the_float32_reference_on_the_cpu(keep_act):
    _logits_against_float32_reference(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu", keep_act)


@pytest.mark.gpu
def test_the_logits_and_their_gradients_match_the_float32_reference_on_the_gpu():
    _logits_against_float32_reference(GPU_CONFIG, GPU_BATCH, GPU_SEQ, "cuda")


def test_the_logits_trace_whole_under_torch_compile_and_give_the_eager_numbers():
    fused = _models(CPU_CONFIG, "cpu")[0]
    tokens, _ = _tokens(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu", seed=2)

    def run(fn):
        fused.zero_grad(set_to_none=True)
        logits = fn(tokens)
        logits.float().pow(2).mean().backward()
        return {"logits": logits.detach(), **{f"d{n}": p.grad for n, p in fused.named_parameters()}}

    compiled, eager = run(torch.compile(fused, fullgraph=True, backend="aot_eager")), run(fused)
    for name in eager:
        assert torch.equal(compiled[name], eager[name]), name


def test_the_backward_fills_no_zeros_for_the_saved_activations():
    """The fused ops return saved activations (x_mid, z, h, rstd, ...) that nothing uses:
    autograd must not make zero gradients for them before each backward (with
    materialised gradients it filled every block's M x 2F z with zeros). Counted here as
    zero-fills outside the fused ops, in the backward of the 3-layer model."""
    from torch.profiler import ProfilerActivity, profile

    cfg = LlamaModelConfig(CPU_CONFIG.vocab, 3, CPU_CONFIG.layer)
    fused = _models(cfg, "cpu")[0]
    tokens, targets = _tokens(cfg, CPU_BATCH, CPU_SEQ, "cpu")
    loss = fused(tokens, targets)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()

    def inside_an_op(e):
        while e is not None:
            if e.name.startswith("epiforge"):
                return True
            e = e.cpu_parent
        return False

    m = CPU_BATCH * CPU_SEQ
    fills = [(e.name, e.input_shapes[0]) for e in prof.events()
             if e.name in ("aten::zero_", "aten::fill_") and e.input_shapes and e.input_shapes[0][:1] == [m]
             and not inside_an_op(e)]
    assert fills == [], fills
    assert all(p.grad is not None for p in fused.parameters())


@pytest.mark.parametrize("store_logits", [False, True], ids=["recomputed-logits", "stored-logits"])
def test_ignored_targets_leave_the_loss_and_gradients_as_torch_cross_entropy_gives(store_logits):
    """Rows whose target is -100 (padding) drop out of the mean and give no gradient, in the
    fused model as in F.cross_entropy(ignore_index=-100); the loss and every gradient still
    match the float32 reference within the same bound."""
    _against_float32_reference(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu", store_logits, padded=True)


def test_ignored_targets_change_the_loss_and_a_target_out_of_range_is_an_error():
    fused, ref, _ = _models(CPU_CONFIG, "cpu")
    tokens, targets = _tokens(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu")
    padded = _padded(targets)
    with torch.no_grad():
        full, part = fused(tokens, targets), fused(tokens, padded)
        # the padded loss is the mean over the kept rows only: not the full mean, and not
        # the full sum over the kept rows divided by all B*S rows
        kept = padded.reshape(-1) != -100
        assert 0 < int(kept.sum()) < kept.numel()
        assert abs(float(part) - float(ref(tokens, padded))) < 1e-2 * float(part)
        assert abs(float(part) - float(full)) > 1e-3
        # every row ignored: NaN, as F.cross_entropy gives
        assert torch.isnan(fused(tokens, torch.full_like(targets, -100)))
        assert torch.isnan(ref(tokens, torch.full_like(targets, -100)))
        for bad in (CPU_CONFIG.vocab, -5):
            wrong = targets.clone()
            wrong[0, 3] = bad
            with pytest.raises(RuntimeError, match=rf"targets must lie in \[0, {CPU_CONFIG.vocab}\) or be ignore_index"):
                fused(tokens, wrong)
        for model in (fused, ref):  # a negative token id would index the embedding from its end
            for bad in (CPU_CONFIG.vocab, -1):
                wrong = tokens.clone()
                wrong[1, 0] = bad
                with pytest.raises(RuntimeError, match=rf"tokens must lie in \[0, {CPU_CONFIG.vocab}\)"):
                    model(wrong, targets)
        fused.ignore_index = 0                         # another ignore_index is honoured, and -100 is then out of range
        with pytest.raises(RuntimeError, match=r"ignore_index \(0\)"):
            fused(tokens, padded)


@pytest.mark.parametrize("store_logits", [False, True], ids=["recomputed-logits", "stored-logits"])
def test_a_batch_of_ignored_rows_only_has_zero_gradients(store_logits):
    """Every target ignore_index (an empty micro-batch of padding): the loss is NaN, as
    F.cross_entropy's, and every gradient zero, as F.cross_entropy's backward gives, so that
    accumulating it adds nothing (0 / 0 in the mean's backward put NaN into every parameter)."""
    fused, ref, _ = _models(CPU_CONFIG, "cpu", store_logits=store_logits)
    tokens, targets = _tokens(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu")
    for model in (fused, ref):
        loss = model(tokens, torch.full_like(targets, -100))
        loss.backward()
        assert torch.isnan(loss)
        for name, p in model.named_parameters():
            assert p.grad is not None and not p.grad.any(), name


#: the fused GEMMs' epilogue names (primitives' trace) -> the expert kernel they belong to
KERNEL_OF_EPILOGUE = {"rstd_rope_posfreq_epi": "k4hf", "rms_partial_epi": "k0", "rmsnorm_swiglu": "k2",
                      "rmsnorm_cross_entropy": "k5", "rmsnorm_cross_entropy_logits": "k5l",
                      "lm_head_ce_backward": "ce-bwd", "rmsnorm_bwd": "k6",
                      "dswiglu_dpreact_mod": "k7", "swiglu_backward_kept_act": "k7-kept-act", "row_scale": "k1"}


@pytest.mark.parametrize("store_logits, keep_act", [(False, False), (True, False), (True, True)],
                         ids=["recomputed-logits", "stored-logits", "stored-logits-kept-act"])
def test_the_model_runs_the_block_re_cut_across_layers_forward_and_backward(store_logits, keep_act):
    """The fused GEMMs a 3-layer model launches, in order (primitives' trace): layer 0's k4hf
    (its norm in torch), then per layer k0, k2, k0 (with the next layer's norm, or the final
    one) and the next layer's k4hf, then k5; backward k1 (the logits again) and k6 (final
    norm), then per layer k7, k6 (post-attention norm), k6 (input norm). No other GEMM runs
    through the primitives (the rest are plain torch GEMMs). With stored logits: k5l, and no
    GEMM before the final norm's k6. With kept act: k7's epilogue without its act output
    (swiglu_backward_kept_act) in k7's place."""
    from epiforge.primitives import trace

    cfg = LlamaModelConfig(vocab=64, n_layers=3, layer=LlamaLayerConfig(d=128, n_heads=2, n_kv_heads=1, head_dim=64,
                                                                        ffn=256))
    model = FusedLlamaModel(cfg, store_logits=store_logits, keep_act=keep_act)
    tokens, targets = _tokens(cfg, 1, 16, "cpu")

    def kernels(calls):
        return [KERNEL_OF_EPILOGUE[c.split(":")[1].split("@")[0]] for c in calls if c.startswith("gemm:")]

    with trace.recording() as forward:
        loss = model(tokens, targets)
    with trace.recording() as backward:
        loss.backward()
    assert kernels(forward) == ["k4hf"] + ["k0", "k2", "k0", "k4hf"] * 2 + ["k0", "k2", "k0",
                                                                           "k5l" if store_logits else "k5"]
    k7 = "k7-kept-act" if keep_act else "k7"
    assert kernels(backward) == ([] if store_logits else ["ce-bwd"]) + ["k6"] + [k7, "k6", "k6"] * 3
    # without targets: the logits by k1 (LM head + row scale), their backward from k6 on
    with trace.recording() as forward:
        logits = model(tokens)
    with trace.recording() as backward:
        logits.float().sum().backward()
    assert kernels(forward) == ["k4hf"] + ["k0", "k2", "k0", "k4hf"] * 2 + ["k0", "k2", "k0", "k1"]
    assert kernels(backward) == ["k6"] + [k7, "k6", "k6"] * 3


def _hf_style_model(sd, cfg, tokens, targets, positions):
    """Hugging Face's LlamaForCausalLM, plainly in float32: embedding, the layer test's
    HF-style layers, the final RMSNorm, lm_head (the embedding if tied), mean cross-entropy."""
    x = sd["model.embed_tokens.weight"][tokens]
    for i in range(cfg.n_layers):
        prefix = f"model.layers.{i}."
        x = hf_style_layer({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}, cfg.layer, x,
                           positions)
    x = sd["model.norm.weight"] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.layer.eps))
    logits = x @ sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).T
    return F.cross_entropy(logits.reshape(-1, cfg.vocab), targets.reshape(-1))


def test_a_state_dict_that_does_not_fit_is_refused_whole_and_changes_nothing():
    """Every entry of an HF state dict must be there, at its exact shape, and no other: a
    missing weight in the last layer, a bias (a Qwen2-style checkpoint), Qwen3's q_norm into a
    LLaMA model, a (1, d) LM head or a (1,) norm that would broadcast, are each one ValueError
    naming the entry, raised before anything is copied (the embedding and layer 0 were
    overwritten before a later layer failed). Older checkpoints' rotary_emb.inv_freq entries
    are no weights and are left out."""
    from epiforge.training.layer import LlamaLayerConfig

    model = FusedLlamaModel(CPU_CONFIG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    good = hf_model_state_dict(CPU_CONFIG, seed=4)
    d, last = CPU_CONFIG.layer.d, f"model.layers.{CPU_CONFIG.n_layers - 1}."
    qwen3 = hf_model_state_dict(LlamaModelConfig(CPU_CONFIG.vocab, CPU_CONFIG.n_layers,
                                                 LlamaLayerConfig(**{**CPU_CONFIG.layer.__dict__, "qk_norm": True})))
    cases = [({k: v for k, v in good.items() if k != last + "mlp.down_proj.weight"},
              rf"missing {last}mlp\.down_proj\.weight \({d}, {CPU_CONFIG.layer.ffn}\)"),
             (good | {"model.layers.0.self_attn.q_proj.bias": torch.zeros(CPU_CONFIG.layer.q_cols)},
              r"unexpected model\.layers\.0\.self_attn\.q_proj\.bias"),
             (qwen3, r"unexpected model\.layers\.0\.self_attn\.k_norm\.weight; unexpected model\.layers\.0\.self_attn\.q_norm"),
             (good | {"lm_head.weight": torch.ones(1, d)}, rf"lm_head\.weight is \(1, {d}\), want \({CPU_CONFIG.vocab}, {d}\)"),
             (good | {last + "input_layernorm.weight": torch.ones(1)}, rf"{last}input_layernorm\.weight is \(1,\), want \({d},\)"),
             (good | {"model.extra.weight": torch.ones(1)}, r"unexpected model\.extra\.weight")]
    tied = {k: v for k, v in good.items() if k != "lm_head.weight"}
    cases += [(good | {f"model.layers.{CPU_CONFIG.n_layers}.mlp.up_proj.weight": torch.ones(1)},
               rf"layers \['{CPU_CONFIG.n_layers}'\] beyond this model's {CPU_CONFIG.n_layers}")]
    for sd, says in cases:
        with pytest.raises(ValueError, match=f"^the state dict does not fit: .*{says}"):
            model.load_hf_state_dict(sd)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # tied word embeddings: said so (HF config's tie_word_embeddings), or read off the state dict
    for sd, tie, says in ((tied, False, r"missing lm_head\.weight"),
                          (good, True, r"lm_head\.weight differs from model\.embed_tokens\.weight")):
        with pytest.raises(ValueError, match=f"^the state dict does not fit: .*{says}"):
            model.load_hf_state_dict(sd, tie_word_embeddings=tie)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for sd, tie in ((tied, None), (tied, True), (tied | {"lm_head.weight": tied["model.embed_tokens.weight"]}, True)):
        model.load_hf_state_dict(sd, tie_word_embeddings=tie)
        assert torch.equal(model.lm_head, model.embed)
    model.load_hf_state_dict(good | {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(32)
                                     for i in range(CPU_CONFIG.n_layers)})
    assert torch.equal(model.embed.float(), good["model.embed_tokens.weight"])


@pytest.mark.parametrize("n_layers, tied", [(2, False), (1, True)], ids=["2-layers", "1-layer-tied-embeddings"])
def test_hf_weights_load_into_both_models_and_match_a_plain_hf_style_model(n_layers, tied):
    """model.embed_tokens, model.layers.N.*, model.norm and lm_head load with the layers'
    layout changes; the float32 reference gives HF's loss to float32 roundoff, the fused one
    within the bf16 bound; given positions are honoured; to_hf_state_dict gives the weights
    back (tied: lm_head as a copy of the embedding). One layer: the entry op straight into the
    loss op."""
    cfg = LlamaModelConfig(vocab=CPU_CONFIG.vocab, n_layers=n_layers, layer=CPU_CONFIG.layer)
    sd = hf_model_state_dict(cfg, seed=3, tied=tied)
    fused, ref = FusedLlamaModel(cfg), ReferenceLlamaModel(cfg)
    fused.load_hf_state_dict(sd)
    ref.load_hf_state_dict(sd)
    tokens, targets = _tokens(cfg, CPU_BATCH, CPU_SEQ, "cpu", seed=4)
    positions = torch.arange(CPU_SEQ)[None, :] + torch.tensor([[0], [1000]])
    want = _hf_style_model(sd, cfg, tokens, targets, positions)
    with torch.no_grad():
        assert rel(ref(tokens, targets, positions), want) < 1e-5
        assert rel(fused(tokens, targets, positions), want) <= REL_TOL
    back = fused.to_hf_state_dict()
    for name, t in sd.items():
        assert torch.equal(back[name].float(), t), name
    if tied:
        assert torch.equal(back["lm_head.weight"].float(), sd["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="beyond"):
        FusedLlamaModel(LlamaModelConfig(cfg.vocab, n_layers - 1 or 1, cfg.layer)).load_hf_state_dict(
            hf_model_state_dict(LlamaModelConfig(cfg.vocab, n_layers + 1, cfg.layer)))


# ---- the ops one by one, against unfused float64 math --------------------------------------


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _unfused_embed(tokens, embed, norm_weight, w_qkv, positions, inv_freq, rotary_cols, eps):
    x = embed[tokens]
    return rotate_adjacent_pairs(_rms(x, norm_weight, eps) @ w_qkv.T, positions, inv_freq, rotary_cols), x


def _unfused_after_attention(attn, residual, w_o, post_norm, w_gu, w_down, eps):
    x_mid = attn @ w_o.T + residual
    z = _rms(x_mid, post_norm, eps) @ w_gu.T
    return x_mid + (F.silu(z[:, 0::2]) * z[:, 1::2]) @ w_down.T


def _unfused_block(attn, residual, w_o, post_norm, w_gu, w_down, next_norm, next_w_qkv, positions, inv_freq,
                   rotary_cols, eps):
    x = _unfused_after_attention(attn, residual, w_o, post_norm, w_gu, w_down, eps)
    return rotate_adjacent_pairs(_rms(x, next_norm, eps) @ next_w_qkv.T, positions, inv_freq, rotary_cols), x


def _unfused_block_loss(attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, targets, eps, store_logits):
    x = _unfused_after_attention(attn, residual, w_o, post_norm, w_gu, w_down, eps)
    return (F.cross_entropy(_rms(x, final_norm, eps) @ w_lm.T, targets, reduction="none"),)


def _unfused_block_logits(attn, residual, w_o, post_norm, w_gu, w_down, final_norm, w_lm, eps):
    x = _unfused_after_attention(attn, residual, w_o, post_norm, w_gu, w_down, eps)
    return (_rms(x, final_norm, eps) @ w_lm.T,)


def _op_inputs(which, cfg=CPU_CONFIG, m=96, seed=0):
    """(args, fused outputs with a loss on them, unfused function): bf16 leaves that need grad."""
    c = cfg.layer
    g = torch.Generator().manual_seed(seed)

    def bf16(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).bfloat16().requires_grad_()

    def norm():
        return (1 + 0.1 * torch.randn(c.d, generator=g)).bfloat16().requires_grad_()

    qkv_rows, rope = c.q_cols + 2 * c.kv_cols, ((torch.arange(m) % 40).float(), c.inv_freq(), c.q_cols + c.kv_cols)
    block = (bf16(m, c.q_cols), bf16(m, c.d), bf16(c.d, c.q_cols, scale=c.q_cols**-0.5), norm(),
             bf16(2 * c.ffn, c.d, scale=c.d**-0.5), bf16(c.d, c.ffn, scale=c.ffn**-0.5))
    if which == "embed_rmsnorm_qkv_rope":
        tokens = torch.randint(0, 40, (m,), generator=g)  # repeated tokens: their gradients add
        return ((tokens, bf16(cfg.vocab, c.d), norm(), bf16(qkv_rows, c.d, scale=c.d**-0.5), *rope, c.eps),
                lambda *a: embed_rmsnorm_qkv_rope(*a)[:2], _unfused_embed)
    keep_act = which.endswith("-kept-act")
    if which.startswith("decoder_block-") or which == "decoder_block":
        kept = (None, None, True) if keep_act else ()  # keep_act follows the optional QK-norm weights
        return ((*block, norm(), bf16(qkv_rows, c.d, scale=c.d**-0.5), *rope, c.eps, *kept),
                lambda *a: decoder_block(*a)[:2], lambda *a: _unfused_block(*a[:12]))
    # logits ~ 3 standard deviations, as a trained LM head gives (the k5 task's inputs)
    w_lm = bf16(cfg.vocab, c.d, scale=3 * c.d**-0.5)
    if which.startswith("decoder_block_logits"):
        return ((*block, norm(), w_lm, c.eps, keep_act), lambda *a: decoder_block_logits(*a)[:1],
                lambda *a: _unfused_block_logits(*a[:9]))
    store_logits = which == "decoder_block_loss-stored-logits"
    return ((*block, norm(), w_lm, torch.randint(0, cfg.vocab, (m,), generator=g), c.eps, store_logits, keep_act),
            lambda *a: decoder_block_loss(*a)[:1], lambda *a: _unfused_block_loss(*a[:11]))


OPS = ["embed_rmsnorm_qkv_rope", "decoder_block", "decoder_block_loss", "decoder_block_loss-stored-logits",
       "decoder_block-kept-act", "decoder_block_loss-kept-act", "decoder_block_logits", "decoder_block_logits-kept-act"]


@pytest.mark.parametrize("which", OPS)
def test_each_op_and_its_gradients_match_unfused_float64_math(which):
    """With a loss on every differentiable output: qkv and the residual stream x it hands on
    (x's cotangent is k6's accumulate input; dropping it would lose the residual gradient),
    the per-row loss with a random weight per row."""
    args, fused, unfused = _op_inputs(which)
    leaves = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
    ref_args = [a.detach().double().requires_grad_() if i in leaves else
                a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for i, a in enumerate(args)]
    g = torch.Generator().manual_seed(5)
    got, want = fused(*args), unfused(*ref_args)
    cotangents = [(1e-2 * torch.randn(w.shape, generator=g)).double() for w in want]
    torch.autograd.backward(got, [c.to(o.dtype) for c, o in zip(cotangents, got)])
    torch.autograd.backward(want, cotangents)
    for i, (o, w) in enumerate(zip(got, want)):
        assert rel(o, w) <= REL_TOL, f"output {i}: {rel(o, w):.2e}"
    for i in leaves:
        err = rel(args[i].grad, ref_args[i].grad)
        assert err <= REL_TOL, f"gradient of argument {i}: {err:.2e}"


@pytest.mark.parametrize("which", OPS)
def test_each_op_passes_torch_library_opcheck(which):
    """Schema, autograd registration and the fake (meta) implementation, as torch checks them."""
    args, _, _ = _op_inputs(which, m=32)
    op = embed_rmsnorm_qkv_rope if which.startswith("embed") else decoder_block_loss \
        if which.startswith("decoder_block_loss") else decoder_block_logits \
        if which.startswith("decoder_block_logits") else decoder_block
    # With stored logits the op's logits output is its backward's workspace: after an eager
    # backward it holds dlogits (test_the_stored_logits_become_dlogits), while a traced
    # backward writes them to a new tensor; test_aot_dispatch_dynamic compares the outputs
    # after the backward, so it would see exactly that. The traced path is tested through
    # torch.compile of the whole model instead (..._under_torch_compile[stored-logits]).
    aot = () if which == "decoder_block_loss-stored-logits" else ("test_aot_dispatch_dynamic",)
    result = torch.library.opcheck(op, args, test_utils=(
        "test_schema", "test_autograd_registration", "test_faketensor", *aot))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_the_stored_logits_become_dlogits():
    """decoder_block_loss with stored logits: its backward overwrites them with dlogits =
    dloss * (softmax - onehot(target)) of the stored logits (one M x V tensor at the backward's
    peak, not two)."""
    args, _, _ = _op_inputs("decoder_block_loss-stored-logits", m=32)
    out = decoder_block_loss(*args)
    loss, logits = out[0], out[8]
    kept = logits.clone()
    weights = torch.rand(loss.shape, generator=torch.Generator().manual_seed(3))
    (loss * weights).sum().backward()
    targets = args[8]
    # the cross-entropy gradient of the logits as stored: their softmax with their own lse
    stored_lse = torch.logsumexp(kept.double(), -1, keepdim=True)
    want = weights.double()[:, None] * (torch.exp(kept.double() - stored_lse)
                                        - torch.nn.functional.one_hot(targets, kept.shape[1]).double())
    assert logits.dtype == torch.bfloat16 and not torch.equal(logits, kept)
    assert ((logits.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()


@pytest.mark.parametrize("store_logits, keep_act", [(False, False), (True, False), (True, True)],
                         ids=["recomputed-logits", "stored-logits", "stored-logits-kept-act"])
def test_the_model_traces_whole_under_torch_compile_and_gives_the_eager_numbers(store_logits, keep_act):
    """Stored logits: the traced backward writes dlogits to a new tensor, the eager one over
    the logits (model_ops.overwrite_logits_with_dlogits); the same numbers either way."""
    fused = _models(CPU_CONFIG, "cpu", store_logits=store_logits, keep_act=keep_act)[0]
    tokens, targets = _tokens(CPU_CONFIG, CPU_BATCH, CPU_SEQ, "cpu", seed=2)
    targets = _padded(targets)                         # the ignore_index mask and assert trace too

    def run(fn):
        fused.zero_grad(set_to_none=True)
        loss = fn(tokens, targets)
        loss.backward()
        return {"loss": loss.detach(), **{f"d{n}": p.grad for n, p in fused.named_parameters()}}

    compiled = run(torch.compile(fused, fullgraph=True, backend="aot_eager"))
    eager = run(fused)
    assert compiled.keys() == eager.keys()
    for name in eager:
        assert torch.equal(compiled[name], eager[name]), name


def test_operands_that_do_not_fit_are_one_line():
    args, _, _ = _op_inputs("decoder_block", m=32)
    with pytest.raises(ValueError, match="do not fit"):
        decoder_block(*args[:7], args[7][:, :-8], *args[8:])
    args, _, _ = _op_inputs("decoder_block_loss", m=32)
    with pytest.raises(ValueError, match="do not fit"):
        decoder_block_loss(*args[:8], args[8][:-1], *args[9:])
    args, _, _ = _op_inputs("embed_rmsnorm_qkv_rope", m=32)
    with pytest.raises(ValueError, match="int64"):
        embed_rmsnorm_qkv_rope(args[0].int(), *args[1:])
    with pytest.raises(ValueError, match="bfloat16"):
        embed_rmsnorm_qkv_rope(args[0], args[1].float(), *args[2:])
    with pytest.raises(ValueError, match="at least one layer"):
        LlamaModelConfig(vocab=520, n_layers=0, layer=CPU_CONFIG.layer)


def test_sizes_the_fused_kernels_cannot_run_are_refused_when_the_model_is_built():
    """A layer config the fused GEMMs cannot run (a K or N not a multiple of 8: d, ffn, the
    attention widths; QK-norm at a head width qkn was not built for) is one ValueError when
    the fused layer or model is made, naming every size at fault, not a kernel's error at the
    first forward; the unfused reference takes it. Sizes below 1 are refused by the config."""
    from epiforge.training.layer import FusedLlamaLayer, LlamaLayerConfig, ReferenceLlamaLayer
    from epiforge.training.ops import QK_NORM_HEAD_DIMS, QKN, _kernel

    base = dict(d=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=768)
    cases = [(dict(d=100), r"d = 100 is not a multiple of 8"), (dict(ffn=100), r"ffn = 100 is not a multiple of 8"),
             (dict(n_heads=3, n_kv_heads=1, head_dim=6),
              r"n_heads \* head_dim = 18 is not a multiple of 8; \(n_heads \+ 2 n_kv_heads\) \* head_dim = 30"),
             (dict(head_dim=32, qk_norm=True), r"qk_norm needs head_dim in \(64, 128, 256\), not 32")]
    for change, says in cases:
        cfg = LlamaLayerConfig(**{**base, **change})
        ReferenceLlamaLayer(cfg)
        with pytest.raises(ValueError, match=f"^FusedLlamaLayer: {says}"):
            FusedLlamaLayer(cfg)
        with pytest.raises(ValueError, match=f"^FusedLlamaModel: {says}"):
            FusedLlamaModel(LlamaModelConfig(vocab=520, n_layers=1, layer=cfg))
    for change in (dict(n_kv_heads=0), dict(d=-1), dict(ffn=0)):
        with pytest.raises(ValueError, match="every size must be at least 1"):
            LlamaLayerConfig(**{**base, **change})
    assert list(QK_NORM_HEAD_DIMS) == sorted(_kernel(QKN).EPILOGUES)  # the kernel's head widths, in one place


def test_inputs_of_the_wrong_shape_are_one_clear_error():
    """The models take integer (batch, seq) tokens and targets of one shape, the layers
    (batch, seq, d) activations; anything else says so in one line before any kernel runs."""
    from epiforge.training.layer import FusedLlamaLayer, ReferenceLlamaLayer

    tokens = torch.randint(0, CPU_CONFIG.vocab, (2, 8))
    for model in (FusedLlamaModel(CPU_CONFIG), ReferenceLlamaModel(CPU_CONFIG)):
        name = type(model).__name__
        for bad_tokens, bad_targets, says in ((tokens.reshape(-1), tokens.reshape(-1), "tokens must be integer"),
                                              (tokens, tokens.float(), "targets must be integer"),
                                              (tokens, tokens[:, :-1], "must have the tokens' shape")):
            with pytest.raises(ValueError, match=f"^{name}: .*{says}") as e:
                model(bad_tokens, bad_targets)
            assert "\n" not in str(e.value)
    d = CPU_CONFIG.layer.d
    for layer in (FusedLlamaLayer(CPU_CONFIG.layer), ReferenceLlamaLayer(CPU_CONFIG.layer)):
        for x in (torch.randn(16, d, dtype=torch.bfloat16), torch.randn(2, 8, d + 1, dtype=torch.bfloat16)):
            with pytest.raises(ValueError, match=rf"^{type(layer).__name__}: x must be \(batch, seq, {d}\), got"):
                layer(x)
        x = torch.randn(2, 8, d, dtype=torch.bfloat16)
        for positions in (torch.arange(7), torch.arange(16).reshape(2, 8)[:, :4], torch.arange(24).reshape(3, 8)):
            with pytest.raises(ValueError, match=rf"^{type(layer).__name__}: positions must be \(8,\) or \(2, 8\), got"):
                layer(x, positions)
    for model in (FusedLlamaModel(CPU_CONFIG), ReferenceLlamaModel(CPU_CONFIG)):
        with pytest.raises(ValueError, match=r"positions must be \(8,\) or \(2, 8\), got \(9,\)"):
            model(tokens, tokens, torch.arange(9))
    # the fused modules run bfloat16 parameters only: one line naming the module and the fix
    for module, args in ((FusedLlamaModel(CPU_CONFIG).float(), (tokens, tokens)),
                         (FusedLlamaLayer(CPU_CONFIG.layer).half(), (torch.randn(2, 8, d).half(),))):
        with pytest.raises(ValueError, match=rf"^{type(module).__name__}: its parameters are torch\.(float32|float16); "
                                             r"the fused kernels take bfloat16 parameters \(module\.to\(torch\.bfloat16\)\)"):
            module(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("store_logits, padded, keep_act", [(False, False, False), (True, False, False),
                                                             (True, True, False), (True, False, True)],
                         ids=["recomputed-logits", "stored-logits", "stored-logits-padded", "stored-logits-kept-act"])
def test_loss_and_every_gradient_match_the_float32_reference_on_the_gpu(store_logits, padded, keep_act):
    _against_float32_reference(GPU_CONFIG, GPU_BATCH, GPU_SEQ, "cuda", store_logits, padded, keep_act)


@pytest.mark.spawns
def test_the_cross_entropy_backward_epilogue_cross_compiles_for_sm90a(sm90a_compile_log):
    """The LM head's logits recomputed with the softmax gradient in the epilogue (a training
    op's own epilogue, no task's): it must build for the H200 too."""
    log = sm90a_compile_log("from epiforge.training.model_ops import lm_head_ce_backward_epilogue\n"
                            "epi = lm_head_ce_backward_epilogue()\n",
                            "h, w, r = torch.randn(256, 64).bfloat16(), torch.randn(512, 64).bfloat16(), torch.rand(256)\n"
                            "epi(h, w, rstd=r, lse=r, dloss=r, targets=torch.zeros(256, dtype=torch.int64))\n")
    assert [(e["epilogue"], e["ok"]) for e in log] == [("lm_head_ce_backward", True)], log


@pytest.mark.spawns
def test_the_kept_act_swiglu_backward_epilogue_cross_compiles_for_sm90a(sm90a_compile_log):
    """keep_act's down-projection dgrad (k7's epilogue without its act output) at the tile
    config k7's TUNED table picks at LLaMA-3.2-1B's MLP (16384 x 8192 x 2048), the shape the
    training benchmarks run."""
    log = sm90a_compile_log("from epiforge import primitives as P\n"
                            "from epiforge.training.ops import K7, _kernel, swiglu_backward_kept_act_epilogue\n"
                            "epi = swiglu_backward_kept_act_epilogue()\n"
                            "config = P.config.GemmConfig.parse(_kernel(K7).TUNED['16384x8192x2048'])\n",
                            "dy, w, z = torch.randn(256, 64).bfloat16(), torch.randn(128, 64).bfloat16(), "
                            "torch.randn(256, 256).bfloat16()\n"
                            "epi(dy, w, c=z, config=config)\n")
    assert [(e["epilogue"], e["ok"]) for e in log] == [("swiglu_backward_kept_act", True)], log


@pytest.mark.parametrize("stored", [False, True], ids=["recomputed-logits", "stored-logits"])
def test_the_cross_entropy_backward_matches_autograd_of_the_loss(stored):
    """lm_head_loss_grads against torch.autograd of the same loss in float64: dlogits (seen
    through dw_lm and dx), with targets on every column, the first and the last included;
    from the logits recomputed by a GEMM, and from the bf16 logits k5l stores."""
    from epiforge.training.model_ops import overwrite_logits_with_dlogits, lm_head_loss_grads

    torch.manual_seed(0)
    m, v, d = 64, 96, 32
    x = torch.randn(m, d).bfloat16()
    w_lm, final_norm = (torch.randn(v, d) / d**0.5).bfloat16(), (1 + 0.1 * torch.randn(d)).bfloat16()
    targets = torch.randint(0, v, (m,))
    targets[:2] = torch.tensor([0, v - 1])
    dloss = torch.rand(m) / m
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
    h = (x.float() * final_norm.float()).bfloat16()
    logits = (h.float() @ w_lm.float().T) * rstd[:, None]
    lse = torch.logsumexp(logits, -1)
    kept = logits.bfloat16()
    given = overwrite_logits_with_dlogits(kept, lse, dloss, targets) if stored else (None, None)
    dx, dnorm, dw = lm_head_loss_grads(dloss, h, x, rstd, lse, final_norm, w_lm, targets, *given)

    x64, n64, w64 = (t.double().requires_grad_() for t in (x, final_norm, w_lm))
    hn = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * n64
    loss = torch.nn.functional.cross_entropy(hn @ w64.T, targets, reduction="none")
    (loss * dloss.double()).sum().backward()
    for name, got, want in (("dx", dx, x64.grad), ("dfinal_norm", dnorm, n64.grad), ("dw_lm", dw, w64.grad)):
        err = (got.double() - want).norm() / want.norm()
        assert err < 0.02, (name, float(err))
    if stored:  # dlogits took the stored logits' place (no second M x V tensor): softmax - onehot, scaled
        assert given[0] is kept
        stored_logits = logits.bfloat16().double()  # the softmax of the logits as stored, with their own lse
        probs = torch.exp(stored_logits - torch.logsumexp(stored_logits, -1, keepdim=True))
        want = dloss.double()[:, None] * (probs - torch.nn.functional.one_hot(targets, v).double())
        assert kept.dtype == torch.bfloat16 and ((kept.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-9).all()
        zdz = (logits.bfloat16().double() * want).sum(-1)
        assert torch.allclose(given[1].double(), zdz, rtol=1e-4, atol=1e-7)
        # the stored logits are what the gradient is taken from: others give another one
        other = lm_head_loss_grads(dloss, h, x, rstd, lse, final_norm, w_lm, targets,
                                   *overwrite_logits_with_dlogits((1.5 * logits).bfloat16(), lse, dloss, targets))[2]
        assert (other.double() - w64.grad).norm() / w64.grad.norm() > 0.1
