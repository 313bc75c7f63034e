"""Training benchmarks (issue 15 section 4): a LLaMA-3 decoder layer's forward + backward,
and a whole training step of a LLaMA-3.2-1B-shaped model, with the fused ops of training/
against cuBLAS + torch.compile(fullgraph) of the same model, eager PyTorch and Liger, each
in one interleaved run (eval/timing.py: every repetition runs every contender once, in a
fresh random order).

    python -m lab.bench.training --out $OUT/training.json                 (the H200: both parts)
    python -m lab.bench.training --parts layer --d 2048 --reps 20 --out F
    python -m lab.bench.training --tiny --device cpu --out F              (toy sizes: every contender
                                                                       runnable here once, and agreeing)
    python -m lab.bench.training --report F [F ...]                       (Markdown tables of result files)

The contenders compute the same function from the same weights (the Liger ones hold them in
Hugging Face's layout, converted by training/layer.py); each row records every contender's
loss on the same first batch, so a contender that computed something else shows.
- layer: x (B, S, d) -> layer -> backward of <y, dy>. "attention" times the layer's causal
  GQA attention alone (torch SDPA, forward + backward, the same views), so each contender's
  non-attention time is its layer time minus that, repetition by repetition. "fused-block"
  is one layer's work as the fused model cuts it (attention, then the block re-cut up to the
  next layer's qkv): the standalone "fused" layer keeps its input norm in torch and its down
  projection as an addmm, which the model fuses across the layer boundary.
- step: loss = model(tokens, targets); loss.backward(); AdamW(fused=True).step(); zero_grad.
  Peak memory: the step's high-water mark above what was allocated before it, plus this
  contender's own parameters and optimizer state (every contender lives on the GPU at once,
  so the allocator's plain peak would count the others).
  The breakdown: the kernels of one profiled step, summed by kind (attention, GEMMs with
  their fused epilogues, the optimizer, the rest), with the largest kernels by name, and
  the GEMM time by GEMM shape, so that each fused GEMM sits beside the cuBLAS GEMM it
  replaces (on a CPU, --tiny: the GEMM calls by shape, whose counts the tests compare).
- host time (both parts, on a GPU): how long the host takes to issue one call while the GPU
  sleeps ahead of it (HostTime). A call whose host time exceeds its GPU time leaves the GPU
  idle between its kernels, which its measured time includes.
- clocks (both parts, on a GPU): the SM clock, power and power-cap share while each profiled
  contender runs alone, back to back (eval.clocks). At the power cap the same cuBLAS GEMM
  takes longer in a step whose clock is lower, so a GEMM gap between two steps at equal
  shapes can be the clock, not the GEMM.

FlashInfer is not a contender here, though lab/bench/run.py and compare time it per kernel: in
flashinfer-python 0.7.2.post1 (the version ../shared/gpu/stage-flashinfer installs; read from
its wheel) the norm, SwiGLU and RoPE ops that run on Hopper have no backward, and its
training kernels (cake_rmsnorm_train.py, RMSNorm forward and backward; chunked_lm_head.py, LM
head + loss) say SM100 / SM103 (/ SM107) only. A layer or a step with FlashInfer would be
FlashInfer's forwards beside torch's backwards, not a FlashInfer training step.
"""

from __future__ import annotations

import argparse
import gc
import math
import re
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Callable

import torch
from pydantic import BaseModel, Field

from epiforge.eval.clocks import ClockSampler, ClockSummary
from epiforge.eval.stats import Ratio, Timing, paired_ratio, summarize
from epiforge.training.layer import FusedLlamaLayer, LlamaLayerConfig, ReferenceLlamaLayer
from epiforge.training.model import FusedLlamaModel, LlamaModelConfig, ReferenceLlamaModel
from epiforge.training.model_ops import decoder_block
from epiforge.training.ops import eager_glue

#: the layers benchmarked: LLaMA-3.2-1B, LLaMA-3-8B and LLaMA-3-70B's decoder layers
LAYERS = {
    2048: LlamaLayerConfig(d=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192),
    4096: LlamaLayerConfig(d=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336),
    8192: LlamaLayerConfig(d=8192, n_heads=64, n_kv_heads=8, head_dim=128, ffn=28672),
}
#: LLaMA-3.2-1B's shape (untied LM head here: both models hold the same separate lm_head)
MODEL_1B = LlamaModelConfig(vocab=128256, n_layers=16, layer=LAYERS[2048])
#: M = 16384 tokens, as in ../shared/notes/anchors-h200.md's training-step anchor
BATCH, SEQ = 8, 2048
TINY_LAYER = LlamaLayerConfig(d=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128)
TINY_MODEL = LlamaModelConfig(vocab=256, n_layers=2, layer=TINY_LAYER)
TINY_BATCH, TINY_SEQ = 2, 32

#: calls of each profiled contender back to back while the GPU's clocks are sampled, per
#: pass: at least CLOCK_CALLS, and enough for CLOCK_PASS_S seconds at its median time
CLOCK_CALLS, CLOCK_PASS_S = 3, 0.5

#: kernel-name patterns of the breakdown's kinds, tried in this order
KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|nvjet|sm90_|GemmSm90|kernel_cutlass", re.I)),
)


class HostTime(BaseModel):
    """How long the host takes to issue one call, its GPU work left queued. Measured with the
    GPU asleep ahead of each call (a lead of HOST_LEAD_CYCLES), so that no launch waits for the
    GPU: where this exceeds the call's GPU time, the call is host-bound and its GPU idles
    between kernels. Measured on a GPU only."""

    ms: float = Field(description="the median over `calls` calls of the host's wall time from the call's start "
                                  "to its return")
    calls: int = Field(ge=1)
    waited: bool = Field(description="some call returned after the lead had ended: it waited for the GPU (a "
                                     "synchronization inside it, a full launch queue, or a lead too short), so "
                                     "`ms` holds GPU time too")
    by_function: list[tuple[str, float]] = Field(
        default_factory=list,
        description="one more call under cProfile (which slows it, so not part of `ms`): the Python functions "
                    "with the most own time, (where, ms), the largest first; 'where' is the file below "
                    "site-packages or the repository, its line and the function")


class Contender(BaseModel):
    """One contender of one row: what it runs and how it did."""

    name: str
    what: str = Field(description="what this contender runs, in words")
    loss: float | None = Field(None, description="its first call's loss (a layer: the mean square of its output; "
                                                 "attention: of its output), on the same weights and inputs")
    first_call_s: float | None = Field(None, description="wall seconds of its first call (compiles, autotuning)")
    peak_gib: float | None = Field(None, description="peak memory of one call (see the module docstring)")
    timing: Timing | None = Field(None, description="its times, from the row's interleaved run")
    host: HostTime | None = Field(None, description="the host's time to issue one call (HostTime); absent in "
                                                    "files from before it or where measuring it failed")
    error: str | None = Field(None, description="why it did not run (then nothing else is set)")


class GemmTime(BaseModel):
    """The GEMM time of one profiled call at one GEMM shape."""

    shape: str = Field(description="'m x n x k', the longer output side first (a GEMM and its transpose are one "
                                   "shape; k is the reduction), or '?' for GEMM kernels whose launching op was "
                                   "not found")
    launches: int = Field(description="on a GPU the GEMM kernels launched at this shape, on a CPU the GEMM calls")
    ms: float = Field(description="on a GPU the kernels' time, on a CPU the calls' CPU time")
    by: list[str] = Field(description="what launched them: fused GEMMs by epilogue name, or the aten op "
                                      "(with '?': the kernels' names)")


class Breakdown(BaseModel):
    """The GPU kernel time of one profiled call, summed by kind, in milliseconds, and the
    GEMM time by GEMM shape."""

    by_kind_ms: dict[str, float]
    top_kernels: list[tuple[str, float]] = Field(description="(kernel name, ms), the largest first")
    kernel_ops: dict[str, list[str]] = Field(default_factory=dict,
                                             description="for each of top_kernels, what launched it: the "
                                                         "outermost epiforge op around the launch, if any, "
                                                         "' > ' the innermost op (at most 3 such pairs)")
    gemms: list[GemmTime] = Field(default_factory=list,
                                   description="the GEMM time by shape, the largest first: each GEMM kernel goes "
                                               "to the op that launched it (a fused GEMM's profiler range, "
                                               "primitives.epilogue.PROFILE_LABEL, or aten::mm / addmm / bmm), "
                                               "so that fused and unfused models can be compared shape by shape")


class Row(BaseModel):
    """One interleaved run: a layer at one width, or the training step."""

    part: str = Field(description="layer | step")
    config: dict = Field(description="the layer's (or model's) sizes and the tokens per call")
    reps: int
    contenders: list[Contender]
    ratios: dict[str, Ratio] = Field(default_factory=dict,
                                     description="'<a>/<b>': a's time over b's, repetition by repetition, with "
                                                 "its bootstrap 95% interval ('non-attention' ones subtract "
                                                 "the attention contender's time first)")
    breakdown: dict[str, Breakdown] = Field(default_factory=dict)
    breakdown_errors: dict[str, str] = Field(default_factory=dict,
                                             description="contender -> why its profiled call gave no breakdown")
    clocks: dict[str, ClockSummary] = Field(
        default_factory=dict,
        description="on a GPU, the clocks (eval.clocks) while each profiled contender ran alone, clock_calls "
                    "calls back to back in each of two passes (the breakdowns' order, then reversed): at the "
                    "power cap the same cuBLAS GEMM runs slower in a step whose SM clock is lower")
    clock_calls: dict[str, int] = Field(default_factory=dict, description="contender -> its calls per pass behind "
                                                                          "`clocks`")


class Report(BaseModel):
    environment: dict
    device: str
    rows: list[Row]


def _liger():
    """Liger's autograd functions, or None where Liger (or a GPU for its Triton) is absent."""
    try:
        from liger_kernel.transformers import functional as lf
    except ImportError:
        return None
    return lf


class LigerLlamaLayer(torch.nn.Module):
    """The same layer as a Liger user writes it, in Hugging Face's layout (rotate_half RoPE,
    gate and up halves): Liger RMSNorm, one cuBLAS QKV GEMM, Liger RoPE, SDPA, cuBLAS O-proj,
    Liger fused add + RMSNorm, one cuBLAS gate/up GEMM, Liger SwiGLU, cuBLAS down-proj +
    residual. Weights are a fused layer's, converted by its to_hf_state_dict."""

    def __init__(self, cfg: LlamaLayerConfig, hf: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        p = lambda t: torch.nn.Parameter(t.detach().clone())  # noqa: E731
        self.input_norm, self.post_norm = p(hf["input_layernorm.weight"]), p(hf["post_attention_layernorm.weight"])
        self.w_qkv = p(torch.cat([hf[f"self_attn.{n}_proj.weight"] for n in "qkv"]))
        self.w_o = p(hf["self_attn.o_proj.weight"])
        self.w_gu = p(torch.cat((hf["mlp.gate_proj.weight"], hf["mlp.up_proj.weight"])))
        self.w_down = p(hf["mlp.down_proj.weight"])
        self.inv_freq = cfg.inv_freq(self.w_o.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lf, c = _liger(), self.cfg
        batch, seq, d = x.shape
        rows = x.reshape(batch * seq, d)
        qkv = lf.liger_rms_norm(rows, self.input_norm, c.eps, in_place=False) @ self.w_qkv.T
        q, k, v = (t.reshape(batch, seq, -1, c.head_dim).transpose(1, 2)
                   for t in qkv.split((c.q_cols, c.kv_cols, c.kv_cols), dim=-1))
        angle = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angle, angle), dim=-1)
        q, k = lf.liger_rope(q, k, emb.cos().to(x.dtype), emb.sin().to(x.dtype))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=c.n_kv_heads != c.n_heads)
        o = attn.transpose(1, 2).reshape(batch * seq, c.q_cols) @ self.w_o.T
        h, residual = lf.liger_fused_add_rms_norm(o, rows, self.post_norm, c.eps, in_place=False)
        gate, up = (h @ self.w_gu.T).chunk(2, dim=-1)
        y = residual + lf.liger_swiglu(gate, up) @ self.w_down.T
        return y.reshape(batch, seq, d)


class LigerLlamaModel(torch.nn.Module):
    """The model from Liger layers, with Liger's fused linear cross-entropy (chunked: the
    logits never exist whole) for the final norm's output."""

    def __init__(self, cfg: LlamaModelConfig, hf: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Parameter(hf["model.embed_tokens.weight"].detach().clone())
        self.layers = torch.nn.ModuleList(
            LigerLlamaLayer(cfg.layer, {k[len(f"model.layers.{i}."):]: v for k, v in hf.items()
                                        if k.startswith(f"model.layers.{i}.")}) for i in range(cfg.n_layers))
        self.final_norm = torch.nn.Parameter(hf["model.norm.weight"].detach().clone())
        self.lm_head = torch.nn.Parameter(hf["lm_head.weight"].detach().clone())

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lf = _liger()
        x = self.embed[tokens]
        for layer in self.layers:
            x = layer(x)
        h = lf.liger_rms_norm(x.reshape(-1, x.shape[-1]), self.final_norm, self.cfg.layer.eps, in_place=False)
        return lf.liger_fused_linear_cross_entropy(h, self.lm_head, targets.reshape(-1))


def _gib(n_bytes: int) -> float:
    return round(n_bytes / 2**30, 3)


def _state_bytes(module: torch.nn.Module, opt: torch.optim.Optimizer | None) -> int:
    n = sum(p.numel() * p.element_size() for p in module.parameters())
    if opt is not None:
        n += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    return n


def _kind(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "rest")


def profile_breakdown(fn: Callable[[], object], top: int = 40, cuda: bool = True) -> Breakdown:
    """The GPU kernels of one call of fn, by kind (KINDS), and its GEMM time by shape, from
    torch.profiler (on a CPU: the GEMM calls' CPU time only)."""
    from torch.profiler import ProfilerActivity, profile

    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=True) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    per_kernel: dict[str, float] = {}
    for e in events:
        if is_kernel(e) and e.device_time_total > 0:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time_total / 1000.0
    by_kind: dict[str, float] = {}
    for name, ms in per_kernel.items():
        by_kind[_kind(name)] = by_kind.get(_kind(name), 0.0) + ms
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:top]
    launchers = kernel_launchers(events)
    return Breakdown(by_kind_ms={k: round(v, 3) for k, v in sorted(by_kind.items())},
                     top_kernels=[(n[:160], round(ms, 3)) for n, ms in ranked],
                     kernel_ops={n[:160]: launchers[n] for n, _ in ranked if n in launchers},
                     gemms=gemm_times(events, on_gpu=cuda))


def kernel_launchers(events) -> dict[str, list[str]]:
    """Kernel name -> the ops that launched it, 'outermost epiforge op > innermost op' (or
    the innermost alone), at most 3 distinct, in the order first seen."""
    found: dict[str, list[str]] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU or not e.kernels:
            continue
        outer, p = None, e
        while p is not None:
            if p.name.startswith("epiforge::"):
                outer = p.name
            p = p.cpu_parent
        path = e.name if outer is None or outer == e.name else f"{outer} > {e.name}"
        for k in e.kernels:
            seen = found.setdefault(k.name, [])
            if path not in seen and len(seen) < 3:
                seen.append(path)
    return found


#: a CUDA runtime or driver API call that launches work (cudaLaunchKernel, cuLaunchKernelEx,
#: cudaLaunchKernelExC, cudaGraphLaunch, ...), as the profiler names it
LAUNCH_CALL = re.compile(r"cu(da)?[A-Za-z]*Launch")

#: aten's GEMM ops: the positions of A and B among their inputs
ATEN_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2),
              "aten::_scaled_mm": (0, 1)}


def is_kernel(event) -> bool:
    """A GPU kernel among profiler events: on the GPU's timeline and not the GPU-side copy of
    a user annotation (record_function ranges such as PROFILE_LABEL's, torch.compile's "## Call
    CompiledFxGraph ##", "Optimizer.step#..."), which spans the kernels inside it and would
    count them twice (it did in the H100 run of 6ecb463)."""
    return event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False)


def gemm_shape(event) -> tuple[tuple[int, int, int], str] | None:
    """((m, n, k), launcher) of a profiled op that is one GEMM call: a fused GEMM's range
    (primitives.epilogue.PROFILE_LABEL) or an aten GEMM with its input shapes recorded (a
    batched one as m = batch x rows); None for any other op."""
    from epiforge.primitives.epilogue import PROFILE_LABEL

    name = event.name
    if name.startswith(PROFILE_LABEL + " "):
        words = name.split(" ")
        try:
            m, n, k = (int(x) for x in words[1].split("x"))
        except ValueError:
            return None
        return (m, n, k), " ".join(words[2:]) or "fused"
    if name not in ATEN_GEMMS:
        return None
    shapes = getattr(event, "input_shapes", None) or []
    ia, ib = ATEN_GEMMS[name]
    if len(shapes) <= ib:
        return None
    a, b = shapes[ia], shapes[ib]
    if len(a) == 2 and len(b) == 2:
        return (a[0], b[1], a[1]), name
    if len(a) == 3 and len(b) == 3:
        return (a[0] * a[1], b[2], a[2]), name
    return None


def gemm_times(events, on_gpu: bool) -> list[GemmTime]:
    """GEMM time by shape (GemmTime). On a GPU each GEMM kernel (KINDS) goes to the
    nearest GEMM op around its launch: the launch call (the runtime or driver API event of
    the kernel's own correlation id) placed in the op tree by its time, else the op the
    profiler linked the kernel to; '?' where neither has one. On a CPU each outermost GEMM
    op counts its CPU time (an aten::mm inside a fused GEMM's range is the emulator's,
    counted by that range)."""
    cpu = torch.autograd.DeviceType.CPU

    def owner(e):
        while e is not None:
            found = gemm_shape(e)
            if found is not None:
                return found
            e = e.cpu_parent
        return None

    table: dict[str, list] = {}

    def add(mnk, by: str, launches: int, ms: float) -> None:
        key = "?" if mnk is None else f"{max(mnk[0], mnk[1])} x {min(mnk[0], mnk[1])} x {mnk[2]}"
        row = table.setdefault(key, [0, 0.0, set()])
        row[0] += launches
        row[1] += ms
        row[2].add(by)

    if on_gpu:
        # A launch call (runtime / driver API event) shares its kernel's CUPTI correlation id
        # (the FunctionEvent's id). Where torch's FunctionEvent has linked_correlation_id (2.13),
        # a launch call and a kernel link to a torch op by it and a torch op links to nothing;
        # torch 2.11's FunctionEvent lacks it, so there a launch call is known by its name and a
        # kernel's torch op by the kernel entry (name, duration) the profiler appended to it.
        linked_ids = all(hasattr(e, "linked_correlation_id") for e in events)
        gemm_kernels = [k for k in events if is_kernel(k) and _kind(k.name) == "gemm"]
        kernel_ids = {k.id for k in gemm_kernels}
        if linked_ids:
            launch_calls = {e.id: e for e in events if e.device_type == cpu and e.linked_correlation_id > 0}
            torch_ops = {e.id: e for e in events if e.device_type == cpu and not e.linked_correlation_id}
            linked_op = {id(k): torch_ops.get(k.linked_correlation_id) for k in gemm_kernels}
        else:
            launch_calls = {e.id: e for e in events
                            if e.device_type == cpu and e.id in kernel_ids and LAUNCH_CALL.match(e.name)}
            appended: dict[tuple[str, float], list] = {}
            for e in events:
                if e.device_type == cpu and not LAUNCH_CALL.match(e.name):
                    for entry in getattr(e, "kernels", None) or []:
                        appended.setdefault((entry.name, round(entry.duration, 3)), []).append(e)
            linked_op = {}
            for k in gemm_kernels:
                ops = appended.get((k.name, round(k.device_time_total, 3)))
                linked_op[id(k)] = ops.pop(0) if ops else None
        for k in gemm_kernels:
            call = launch_calls.get(k.id)
            found = owner(call.cpu_parent) if call is not None else None
            if found is None:
                found = owner(linked_op[id(k)])
            add(found and found[0], found[1] if found else k.name[:80], 1, k.device_time_total / 1000.0)
    else:
        for e in events:
            found = gemm_shape(e) if e.device_type == cpu else None
            if found is not None and owner(e.cpu_parent) is None:
                add(found[0], found[1], 1, e.cpu_time_total / 1000.0)
    ranked = sorted(table.items(), key=lambda kv: -kv[1][1])
    return [GemmTime(shape=key, launches=n, ms=round(ms, 3), by=sorted(by)) for key, (n, ms, by) in ranked]


class _Entry:
    """A contender while it runs: its call, the state it owns, its record."""

    def __init__(self, record: Contender, call: Callable[[int], object], state_bytes: Callable[[], int]):
        self.record, self.call, self.state_bytes = record, call, state_bytes


def _value(out: torch.Tensor | None) -> float | None:
    """A loss as it is; a layer's output as its mean square (so contenders can be compared)."""
    if out is None:
        return None
    out = out.detach().float()
    return round(float(out if out.numel() == 1 else (out * out).mean()), 6)


def _why(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__


def _first_call(entry: _Entry, cuda: bool) -> None:
    """Call once (compiles), then once more measuring the peak memory."""
    if entry.record.error is not None:
        return
    try:
        t0 = time.perf_counter()
        out = entry.call(0)
        if cuda:
            torch.cuda.synchronize()
        entry.record.first_call_s = round(time.perf_counter() - t0, 2)
        entry.record.loss = _value(out)
        if cuda:
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            entry.call(1)
            torch.cuda.synchronize()
            entry.record.peak_gib = _gib(torch.cuda.max_memory_allocated() - before + entry.state_bytes())
    except Exception as e:  # a contender that cannot run is recorded as such; the others go on
        entry.record.error = _why(e)
        if cuda:
            torch.cuda.synchronize()


def _run_row(part: str, config: dict, entries: list[_Entry], reps: int, cuda: bool,
             ratio_pairs: list[tuple[str, str]], breakdown_of: tuple[str, ...] = ()) -> Row:
    from epiforge.eval.timing import time_cuda_interleaved

    for entry in entries:
        _first_call(entry, cuda)
        print(f"  {part} {entry.record.name}: {entry.record.error or f'first call {entry.record.first_call_s} s'}",
              file=sys.stderr, flush=True)
    ok = [e for e in entries if e.record.error is None]
    row = Row(part=part, config=config, reps=reps if cuda else 0, contenders=[e.record for e in entries])
    if not cuda:  # nothing timed; the GEMM calls by shape (profile_breakdown on a CPU)
        _breakdowns(row, ok, breakdown_of, cuda)
        return row
    timings = time_cuda_interleaved({e.record.name: (e.call, [(i,) for i in range(2)]) for e in ok},
                                    warmup=1, reps=reps)
    for e in ok:
        e.record.timing = timings[e.record.name]
    for a, b in ratio_pairs:
        if a in timings and b in timings:
            row.ratios[f"{a}/{b}"] = paired_ratio(timings[a], timings[b], ci=True)
    if "attention" in timings:  # the non-attention time: each repetition's layer time minus its attention time
        attn = timings["attention"].samples_us
        rest = {n: summarize([t - a for t, a in zip(timings[n].samples_us, attn)], keep=True)
                for n in timings if n != "attention"}
        for a, b in ratio_pairs:
            if a in rest and b in rest:
                row.ratios[f"non-attention {a}/{b}"] = paired_ratio(rest[a], rest[b], ci=True)
    _breakdowns(row, ok, breakdown_of, cuda)
    row.clock_calls = {name: clock_calls(e) for name in breakdown_of for e in ok if e.record.name == name}
    try:  # the clocks are evidence beside the row: their failure costs them, not the timings
        row.clocks = contender_clocks(ok, row.clock_calls, torch.cuda.synchronize, torch.cuda.current_device())
    except Exception as e:  # noqa: BLE001 - recorded in the row
        row.clocks = {name: ClockSummary.missing(f"sampling failed: {_why(e)}") for name in row.clock_calls}
    # last, after everything timed: cProfile's hook must not touch a compiled contender's timings
    for e in ok:
        try:  # evidence beside the timings: a failure costs only this
            e.record.host = host_time(e.call, cuda, profile_top=HOST_PROFILE_TOP if e.record.name in breakdown_of else 0)
        except Exception as err:  # noqa: BLE001 - reported; the row goes on
            print(f"  {part} {e.record.name}: host time not measured: {_why(err)}", file=sys.stderr, flush=True)
    return row


#: the Python functions kept per profiled contender (HostTime.by_function)
HOST_PROFILE_TOP = 25

#: the GPU sleep queued before each host_time call: about 0.5 s at the H200's boost clock
#: (more at its power cap), longer than any layer's or step's host work measured so far
HOST_LEAD_CYCLES = 1_000_000_000


def host_time(call: Callable[[int], object], cuda: bool, calls: int = 3, lead_cycles: int = HOST_LEAD_CYCLES,
              profile_top: int = 0) -> HostTime:
    """The host's time to issue call(i) (HostTime). On a GPU each call follows a sleep of
    lead_cycles and an event behind it; if that event has completed when the call returns,
    the call may have waited for the GPU (`waited`). Each call's GPU work is finished
    before the next. profile_top > 0: one more call under cProfile, its profile_top
    functions with the most own time (`by_function`). cuda=False: no lead, the calls' wall
    time (what the tests check of the timing, the median and the profile on a CPU)."""
    import cProfile
    import pstats

    times, waited = [], False
    profiler = cProfile.Profile()
    for i in range(calls + (profile_top > 0)):
        profiled = i == calls
        if cuda:
            torch.cuda.synchronize()
            torch.cuda._sleep(lead_cycles)
            lead_end = torch.cuda.Event()
            lead_end.record()
        t0 = time.perf_counter()
        if profiled:
            profiler.enable()
        call(i % 2)
        if profiled:
            profiler.disable()
        else:
            times.append((time.perf_counter() - t0) * 1000.0)
        if cuda:
            waited |= not profiled and lead_end.query()
            torch.cuda.synchronize()
    by_function = []
    if profile_top > 0:
        own = pstats.Stats(profiler).stats  # {(file, line, function): (calls, primitive calls, own s, cumulative s, callers)}
        ranked = sorted(own.items(), key=lambda kv: -kv[1][2])[:profile_top]
        by_function = [(_code_where(*where), round(stat[2] * 1000.0, 3)) for where, stat in ranked]
    return HostTime(ms=round(statistics.median(times), 3), calls=calls, waited=waited, by_function=by_function)


def _code_where(filename: str, line: int, function: str) -> str:
    """A profiled function's place without this machine's paths (epilogue_stalls.short_path);
    built-ins as cProfile names them."""
    from lab.bench.epilogue_stalls import short_path

    return function if filename == "~" else f"{short_path(filename)}:{line}({function})"


def clock_calls(entry: _Entry) -> int:
    """Calls per clock-sampling pass: CLOCK_CALLS, or more to fill CLOCK_PASS_S at its median."""
    t = entry.record.timing
    return max(CLOCK_CALLS, math.ceil(CLOCK_PASS_S * 1e6 / t.median_us)) if t is not None else CLOCK_CALLS


def contender_clocks(entries: list[_Entry], calls: dict[str, int], sync: Callable[[], None], device: int = 0,
                     sampler: Callable[[int], ClockSampler] | None = None) -> dict[str, ClockSummary]:
    """The GPU's clocks while each contender named in `calls` runs alone, that many calls back
    to back, in two passes (calls' order, then reversed, so that neither side always follows
    the same contender); each contender's readings of both passes in one summary. Where NVML
    cannot be read nothing is called and every summary says why; a contender whose call
    fails gets that reason. sampler: makes the sampler for an NVML index (default
    eval.clocks.ClockSampler; a test passes its own)."""
    from epiforge.eval.clocks import nvml_index, summarize_readings

    make = sampler or ClockSampler
    index = nvml_index(device)
    with make(index) as probe:
        pass
    if probe.absent and not probe.readings:
        return {name: ClockSummary.missing(probe.absent) for name in calls}
    chosen = [e for name in calls for e in entries if e.record.name == name]
    readings: dict[str, list] = {e.record.name: [] for e in chosen}
    failed: dict[str, str] = {}
    for order in (chosen, chosen[::-1]):
        for e in order:
            name = e.record.name
            if name in failed:
                continue
            pass_sampler = make(index)
            try:
                sync()
                with pass_sampler:
                    for i in range(calls[name]):
                        e.call(i % 2)
                    sync()
            except Exception as err:  # noqa: BLE001 - recorded; the other contenders go on
                failed[name] = f"its calls failed: {_why(err)}"
                continue
            readings[name] += pass_sampler.readings
            if not readings[name] and order is not chosen:  # neither pass read anything
                failed[name] = pass_sampler.absent or "no reading was taken"
    return {name: ClockSummary.missing(failed[name]) if name in failed
            else summarize_readings(got, device=index) if got else ClockSummary.missing("no reading was taken")
            for name, got in readings.items()}


def _breakdowns(row: Row, ok: list[_Entry], names: tuple[str, ...], cuda: bool) -> None:
    for name in names:
        entry = next((e for e in ok if e.record.name == name), None)
        if entry is not None:
            try:  # a failed profile costs its breakdown, not the row's timings
                row.breakdown[name] = profile_breakdown(lambda: entry.call(0), cuda=cuda)
            except Exception as e:  # noqa: BLE001 - any failure is recorded in the row
                row.breakdown_errors[name] = _why(e)


def _skipped(entries: list[_Entry], skip: tuple[str, ...]) -> list[_Entry]:
    """Contenders named in --skip stay in the row, marked as skipped (nothing run)."""
    for e in entries:
        if e.record.name in skip:
            e.record.error, e.call = "skipped (--skip)", None
    return entries


def _fused_and_unfused(fused_type, reference_type, cfg, device):
    """The fused module and its unfused bf16 twin holding the same (seeded) weights."""
    torch.manual_seed(0)
    fused = fused_type(cfg, device=device)
    eager = reference_type(cfg, torch.bfloat16, device=device)
    eager.load_state_dict(fused.state_dict())
    return fused, eager


def _layer_inputs(cfg: LlamaLayerConfig, batch: int, seq: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device="cpu").manual_seed(0)
    return [(torch.randn(batch, seq, cfg.d, generator=g).to(device, torch.bfloat16).requires_grad_(),
             torch.randn(batch, seq, cfg.d, generator=g).to(device, torch.bfloat16)) for _ in range(2)]


def bench_layer(cfg: LlamaLayerConfig, batch: int, seq: int, reps: int, device: str, skip: tuple[str, ...] = ()) -> Row:
    """One decoder layer's forward + backward, every contender on the same weights and inputs."""
    cuda = device == "cuda"
    fused, eager = _fused_and_unfused(FusedLlamaLayer, ReferenceLlamaLayer, cfg, device)
    inputs = _layer_inputs(cfg, batch, seq, device)

    def fwd_bwd(layer, context=nullcontext):
        def call(i):
            x, dy = inputs[i]
            for p in layer.parameters():
                p.grad = None
            x.grad = None
            with context():
                y = layer(x)
                y.backward(dy)
            return y
        return call

    entries = [
        _Entry(Contender(name="fused", what="training/ FusedLlamaLayer: k4hf, SDPA, k0, k2 forward; k7 -> k6, k6 "
                                           "backward (input norm and down-proj residual in torch)"),
               fwd_bwd(fused), lambda: _state_bytes(fused, None)),
        _Entry(Contender(name="fused-block", what="one layer's work as FusedLlamaModel cuts it (the block re-cut): "
                                                 "SDPA from the layer's qkv, then k0, k2, k0 + the next input norm, "
                                                 "k4hf of the next QKV; k6, k7 -> k6 backward. This layer's norm and "
                                                 "QKV weights stand in for the next layer's"),
               _block_call(fused, inputs, batch, seq), lambda: _state_bytes(fused, None)),
        _Entry(Contender(name="fused-block-kept-act", what="fused-block with keep_act: SwiGLU's forward output "
                                                          "kept for the backward, whose down-projection dgrad is "
                                                          "k7's epilogue without its act store"),
               _block_call(fused, inputs, batch, seq, keep_act=True), lambda: _state_bytes(fused, None)),
        _Entry(Contender(name="fused-eager-glue", what="the same fused layer with the torch glue between its GEMMs "
                                                      "run eagerly (training.ops.eager_glue: an ablation)"),
               fwd_bwd(fused, eager_glue), lambda: _state_bytes(fused, None)),
        _Entry(Contender(name="eager", what="the same layer, unfused bf16 PyTorch (cuBLAS GEMMs), eager"),
               fwd_bwd(eager), lambda: _state_bytes(eager, None)),
    ]
    if cuda:
        compiled = torch.compile(eager, fullgraph=True)
        entries.append(_Entry(Contender(name="compile", what="the same unfused bf16 layer under "
                                                            "torch.compile(fullgraph=True): cuBLAS + Inductor"),
                              fwd_bwd(compiled), lambda: _state_bytes(eager, None)))
        if _liger() is not None:
            liger = LigerLlamaLayer(cfg, fused.to_hf_state_dict())
            entries.append(_Entry(Contender(name="liger", what="the same layer from Liger's RMSNorm, RoPE, fused "
                                                              "add + RMSNorm and SwiGLU, cuBLAS GEMMs (HF layout)"),
                                  fwd_bwd(liger), lambda: _state_bytes(liger, None)))
        else:
            entries.append(_Entry(Contender(name="liger", what="Liger-Kernel", error="liger_kernel is not installed"),
                                  None, lambda: 0))
        entries.append(_Entry(Contender(name="attention", what="the layer's attention alone (torch SDPA, causal "
                                                              "GQA, forward + backward, the same views)"),
                              _attention_call(cfg, batch, seq, device), lambda: 0))
    config = {"d": cfg.d, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
              "ffn": cfg.ffn, "batch": batch, "seq": seq, "tokens": batch * seq}
    pairs = [("compile", "fused"), ("eager", "fused"), ("liger", "fused"), ("fused-eager-glue", "fused"),
             ("fused-block", "fused"), ("compile", "fused-block"), ("liger", "fused-block"),
             ("fused-block", "fused-block-kept-act"), ("compile", "fused-block-kept-act")]
    return _run_row("layer", config, _skipped(entries, skip), reps, cuda, pairs,
                    breakdown_of=("fused", "fused-block", "fused-block-kept-act", "compile", "liger", "eager"))


def _block_call(fused: FusedLlamaLayer, inputs: list[tuple[torch.Tensor, torch.Tensor]], batch: int, seq: int,
                keep_act: bool = False):
    """A layer's forward + backward as the fused model runs it per layer (training/model.py):
    attention from this layer's qkv, then decoder_block (with keep_act as given) up to the
    next layer's qkv. Its GEMMs
    are one layer's (the next QKV's stand in for this one's, whose input gradient the previous
    block computes), so its time compares with a whole layer's. The qkv leaves are made once,
    outside the timing, by the fused layer's own first op; the backward seeds the output x
    with the layer's dy and the next qkv with a fixed random gradient."""
    c = fused.cfg
    rope = (fused._positions(batch, seq, None, inputs[0][0].device), fused.inv_freq, c.q_cols + c.kv_cols)
    g = torch.Generator(device="cpu").manual_seed(2)
    leaves, dqkv = [], []
    with torch.no_grad():
        for x, _ in inputs:
            qkv = fused.attention_input(x.detach().reshape(batch * seq, c.d), rope[0])
            leaves.append(qkv.requires_grad_())
            dqkv.append((torch.randn(qkv.shape, generator=g) * 0.1).to(qkv.device, qkv.dtype))

    def call(i):
        x, dy = inputs[i]
        for p in fused.parameters():
            p.grad = None
        x.grad = leaves[i].grad = None
        attn = fused._attention(leaves[i], batch, seq)
        qkv_next, out, *_ = decoder_block(attn, x.reshape(batch * seq, c.d), fused.w_o, fused.post_norm, fused.w_gu,
                                          fused.w_down, fused.input_norm, fused.w_qkv, *rope, c.eps,
                                          *fused.qk_norms(), keep_act)
        torch.autograd.backward([out, qkv_next], [dy.reshape(batch * seq, c.d), dqkv[i]])
        return out
    return call


def _attention_call(cfg: LlamaLayerConfig, batch: int, seq: int, device):
    g = torch.Generator(device="cpu").manual_seed(1)
    width = cfg.q_cols + 2 * cfg.kv_cols
    qkvs = [torch.randn(batch * seq, width, generator=g).to(device, torch.bfloat16).requires_grad_() for _ in range(2)]
    douts = [torch.randn(batch * seq, cfg.q_cols, generator=g).to(device, torch.bfloat16) for _ in range(2)]
    layer = ReferenceLlamaLayer(cfg, torch.bfloat16, device=device)

    def call(i):
        qkvs[i].grad = None
        out = layer._attention(qkvs[i], batch, seq)
        out.backward(douts[i])
        return out
    return call


def bench_step(cfg: LlamaModelConfig, batch: int, seq: int, reps: int, device: str, skip: tuple[str, ...] = ()) -> Row:
    """A whole training step (forward, backward, fused AdamW) of every contender."""
    cuda = device == "cuda"
    fused, eager = _fused_and_unfused(FusedLlamaModel, ReferenceLlamaModel, cfg, device)
    g = torch.Generator(device="cpu").manual_seed(0)
    batches = [(torch.randint(0, cfg.vocab, (batch, seq), generator=g).to(device),
                torch.randint(0, cfg.vocab, (batch, seq), generator=g).to(device)) for _ in range(2)]
    entries: list[_Entry] = []

    def add(name, what, model, params_of, context=nullcontext):
        # lr 0: the optimizer does all its work and every contender's weights stay the same,
        # so every first-call loss is of the same weights
        opt = torch.optim.AdamW(params_of.parameters(), lr=0.0, fused=cuda)

        def call(i):
            tokens, targets = batches[i]
            with context():
                loss = model(tokens, targets)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        entries.append(_Entry(Contender(name=name, what=what), call, lambda: _state_bytes(params_of, opt)))

    liger = LigerLlamaModel(cfg, fused.to_hf_state_dict()) if cuda and _liger() is not None else None
    add("fused", "training/ FusedLlamaModel (k4hf, k0, k2, k0 + next norm; k7 -> k6, k6; k5l loss, which keeps "
                 "the bf16 logits: its backward takes dlogits from them in one compiled pass), eager", fused, fused)
    add("fused-eager-glue", "the same fused model with the torch glue between its GEMMs run eagerly "
                            "(training.ops.eager_glue: an ablation)", fused, fused, eager_glue)
    add("fused-recomputed-logits", "the same fused model with store_logits=False: k5 keeps no logits and its "
                                   "backward recomputes them in a second LM-head GEMM whose epilogue is the "
                                   "softmax gradient", fused, fused, partial(_recomputing_logits, fused))
    add("fused-kept-act", "the same fused model with keep_act: every layer keeps SwiGLU's forward output for "
                          "its backward, whose down-projection dgrad is k7's epilogue without its act store",
        fused, fused, partial(_keeping_act, fused))
    add("eager", "the same model, unfused bf16 PyTorch, eager (float32 logits for the loss)", eager, eager)
    if cuda:
        add("fused+compile", "FusedLlamaModel under torch.compile(fullgraph=True): the torch glue between "
                             "the fused ops compiled", torch.compile(fused, fullgraph=True), fused)
        add("compile", "the unfused bf16 model under torch.compile(fullgraph=True): cuBLAS + Inductor",
            torch.compile(eager, fullgraph=True), eager)
        if liger is not None:
            add("liger", "Liger layers and Liger's fused linear cross-entropy (chunked, no logits kept)", liger, liger)
        else:
            entries.append(_Entry(Contender(name="liger", what="Liger-Kernel", error="liger_kernel is not installed"),
                                  None, lambda: 0))
    config = {"vocab": cfg.vocab, "n_layers": cfg.n_layers, "d": cfg.layer.d, "n_heads": cfg.layer.n_heads,
              "n_kv_heads": cfg.layer.n_kv_heads, "head_dim": cfg.layer.head_dim, "ffn": cfg.layer.ffn,
              "batch": batch, "seq": seq, "tokens": batch * seq,
              "parameters": sum(p.numel() for p in fused.parameters())}
    pairs = [("compile", "fused"), ("compile", "fused+compile"), ("eager", "fused"), ("liger", "fused"),
             ("liger", "fused+compile"), ("fused-eager-glue", "fused"), ("compile", "fused-recomputed-logits"),
             ("fused-recomputed-logits", "fused"), ("liger", "fused-recomputed-logits"),
             ("fused", "fused-kept-act"), ("compile", "fused-kept-act")]
    return _run_row("step", config, _skipped(entries, skip), reps, cuda, pairs,
                    breakdown_of=("fused", "fused-recomputed-logits", "fused-kept-act", "fused+compile", "compile",
                                  "liger", "eager"))


@contextmanager
def _keeping_act(model: FusedLlamaModel):
    """Inside: the fused model's layers keep SwiGLU's forward output for their backward."""
    model.keep_act = True
    try:
        yield
    finally:
        model.keep_act = False


@contextmanager
def _recomputing_logits(model: FusedLlamaModel):
    """Inside: the fused model's LM head keeps no logits (k5) and its backward recomputes them."""
    model.store_logits = False
    try:
        yield
    finally:
        model.store_logits = True


def render(reports: list[Report]) -> str:
    """Markdown tables of result files: per row, each contender's time, its time over the
    fused one's (per repetition, with the 95% interval), its peak memory and first-call loss;
    then the kernel breakdowns."""
    lines = []
    for report in reports:
        env = report.environment
        lines += [f"{env.get('gpu', report.device)}, driver {env.get('driver')}, torch {env.get('torch')}, "
                  f"quack-kernels {env.get('quack-kernels')}, {env.get('date')}, commit {str(env.get('commit'))[:10]}",
                  f"`{env.get('command')}`", ""]
        for row in report.rows:
            c = row.config
            head = (f"layer d = {c['d']}, {c['n_heads']}/{c['n_kv_heads']} heads of {c['head_dim']}, F = {c['ffn']}"
                    if row.part == "layer" else
                    f"training step, {c['n_layers']} layers, d = {c['d']}, V = {c['vocab']}, "
                    f"{c['parameters'] / 1e9:.2f} B parameters")
            lines += [f"**{head}, {c['tokens']} tokens** ({row.reps} repetitions)", "",
                      "| contender | median ms | k tokens/s | time / fused | non-attention / fused | peak GiB | loss |",
                      "|---|---|---|---|---|---|---|"]
            for k in row.contenders:
                if k.timing is None:
                    lines.append(f"| {k.name} | {k.error or 'not timed'} | | | | | |")
                    continue

                def ratio(key: str) -> str:
                    r = row.ratios.get(key)
                    return f"{r.median:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" if r else ""

                lines.append(f"| {k.name} | {k.timing.median_us / 1000:.2f} | {c['tokens'] / k.timing.median_us * 1e3:.1f} | "
                             f"{ratio(f'{k.name}/fused')} | "
                             f"{ratio(f'non-attention {k.name}/fused')} | {k.peak_gib if k.peak_gib is not None else ''} "
                             f"| {k.loss if k.loss is not None else ''} |")
            lines.append("")
            others = [f"{key} {r.median:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" for key, r in row.ratios.items()
                      if not key.endswith("/fused")]
            lines += [f"Other ratios (per repetition, 95% interval): {'; '.join(others)}", ""] if others else []
            lines += render_host_times(row)
            lines += render_gemm_times(row)
            if any(b.by_kind_ms for b in row.breakdown.values()):
                kinds = sorted({kind for b in row.breakdown.values() for kind in b.by_kind_ms})
                lines += ["GPU kernel time of one profiled call, ms:", "",
                          "| contender | " + " | ".join(kinds) + " | total |", "|---" * (len(kinds) + 2) + "|"]
                for name, b in row.breakdown.items():
                    lines.append(f"| {name} | " + " | ".join(f"{b.by_kind_ms.get(kind, 0.0):.1f}" for kind in kinds)
                                 + f" | {sum(b.by_kind_ms.values()):.1f} |")
                lines.append("")
            lines += [f"No breakdown for {name}: {why}" for name, why in row.breakdown_errors.items()]
            lines += [""] if row.breakdown_errors else []
            lines += render_clocks(row)
    return "\n".join(lines)


def render_host_times(row: Row) -> list[str]:
    """The host's time to issue one call (Contender.host) beside the median time, one line."""
    have = [k for k in row.contenders if k.host is not None]
    if not have:
        return []
    parts = [f"{k.name} {k.host.ms:.2f}" + (f" of {k.timing.median_us / 1000:.2f}" if k.timing else "")
             + (" (waited for the GPU)" if k.host.waited else "") for k in have]
    lines = [f"Host time to issue one call, ms (the GPU kept busy ahead of it; of the median time): "
             f"{'; '.join(parts)}", ""]
    for k in have:
        if k.host.by_function:
            lines += [f"- {k.name}, the functions with the most own time in one call under cProfile, ms: "
                      + ", ".join(f"{where} {ms:.2f}" for where, ms in k.host.by_function[:8]), ""]
    return lines


def render_clocks(row: Row) -> list[str]:
    """The clocks each profiled contender ran at (Row.clocks), one line each."""
    if not row.clocks:
        return []
    return (["GPU clocks while each contender ran alone, in two passes of calls back to back:", ""]
            + [f"- {name} ({row.clock_calls.get(name, '?')} calls a pass): {summary.line()}"
               for name, summary in row.clocks.items()] + [""])


def render_gemm_times(row: Row) -> list[str]:
    """The row's GEMM time by shape, one column per profiled contender: ms (launches); with
    both fused and compile profiled, their difference per shape (where the GEMM gap is)."""
    have = {name: {g.shape: g for g in b.gemms} for name, b in row.breakdown.items() if b.gemms}
    if not have:
        return []
    order: dict[str, float] = {}
    for times in have.values():
        for key, g in times.items():
            order[key] = max(order.get(key, 0.0), g.ms)
    gap = "fused" in have and "compile" in have

    def diff(key: str | None) -> list[str]:
        if not gap:
            return []
        ms = {n: (have[n][key].ms if key in have[n] else 0.0) if key else sum(g.ms for g in have[n].values())
              for n in ("fused", "compile")}
        return [f"{ms['fused'] - ms['compile']:+.2f}"]

    cuda = row.reps > 0
    head = [*have, *(["fused - compile"] if gap else [])]
    lines = [f"{'GEMM kernel' if cuda else 'GEMM call (CPU)'} time by GEMM shape (m x n x k, the longer output "
             "side first), ms (launches):", "", "| shape | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for key in sorted(order, key=lambda k: -order[k]):
        cells = [f"{t[key].ms:.2f} ({t[key].launches})" if key in t else "" for t in have.values()]
        lines.append(f"| {key} | " + " | ".join(cells + diff(key)) + " |")
    totals = [f"{sum(g.ms for g in t.values()):.2f} ({sum(g.launches for g in t.values())})" for t in have.values()]
    lines.append("| total | " + " | ".join(totals + diff(None)) + " |")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.bench.training", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", choices=("layer", "step"), default=["layer", "step"])
    ap.add_argument("--d", nargs="+", type=int, default=sorted(LAYERS), choices=sorted(LAYERS),
                    help="layer widths (default: all)")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions of the layer rows (default 20)")
    ap.add_argument("--step-reps", type=int, default=10, help="timed repetitions of the step row (default 10)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                    help="contenders not to run (e.g. fused+compile, whose first call did not end in 5 min on the H200)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (a check that every contender runs and agrees)")
    ap.add_argument("--out", help="the result file (JSON) to write")
    ap.add_argument("--report", nargs="+", metavar="FILE", help="print result files as Markdown tables (runs nothing)")
    args = ap.parse_args(argv)
    if args.report:
        try:
            reports = [Report.model_validate_json(open(f).read()) for f in args.report]
        except (OSError, ValueError) as e:
            print(f"bench.training: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        print(render(reports))
        return 0
    if not args.out:
        ap.error("--out is required (or --report)")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.training: --device cuda, but no CUDA device is visible", file=sys.stderr)
        return 2
    if args.device == "cpu" and not args.tiny:
        print("bench.training: on a CPU only --tiny runs (the emulator is not timed)", file=sys.stderr)
        return 2
    from lab.bench.gpu_env import report_json
    from epiforge.eval.machine import command_line
    from epiforge.eval import machine

    environment = machine.fingerprint(args.device, command_line("lab.bench.training", argv))
    rows: list[Row] = []

    def write(row: Row) -> None:  # after every row: a run cut short keeps what it finished
        rows.append(row)
        with open(args.out, "w") as f:
            f.write(report_json(Report(environment=environment, device=args.device, rows=rows).model_dump(mode="json")))
            f.write("\n")

    small = (TINY_BATCH, TINY_SEQ) if args.tiny else (BATCH, SEQ)
    if "layer" in args.parts:
        for d in ([None] if args.tiny else args.d):
            cfg = TINY_LAYER if args.tiny else LAYERS[d]
            print(f"layer d={cfg.d}", file=sys.stderr, flush=True)
            write(bench_layer(cfg, *small, args.reps, args.device, tuple(args.skip)))
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    if "step" in args.parts:
        print("training step", file=sys.stderr, flush=True)
        write(bench_step(TINY_MODEL if args.tiny else MODEL_1B, *small, args.step_reps, args.device, tuple(args.skip)))
    for row in rows:
        print(f"{row.part} {row.config.get('d')}: " + ", ".join(f"{k} {v.median:.3f}" for k, v in row.ratios.items()),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
