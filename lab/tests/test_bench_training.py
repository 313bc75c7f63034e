"""lab/bench/training.py: the layer and training-step benchmark runs end to end at toy sizes on
the CPU (the fused ops through the emulator), and its contenders compute the same function;
on a GPU, the Liger contenders do too."""

import json

import pytest
import torch

from lab.bench import training as bt


@pytest.mark.spawns
def test_tiny_run_writes_a_report_whose_contenders_agree(tmp_path):
    out = tmp_path / "training.json"
    assert bt.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    report = bt.Report.model_validate(json.loads(out.read_text()))
    assert [r.part for r in report.rows] == ["layer", "step"]
    assert report.environment["commit"] and "bench.training" in report.environment["command"]
    for row in report.rows:
        by_name = {c.name: c for c in row.contenders}
        want = {"fused", "fused-eager-glue", "eager"} | ({"fused-recomputed-logits", "fused-kept-act"}
                                                         if row.part == "step" else
                                                         {"fused-block", "fused-block-kept-act"})
        assert set(by_name) == want, by_name
        assert all(c.error is None and c.loss is not None for c in row.contenders), row.contenders
        fused, eager = by_name["fused"].loss, by_name["eager"].loss
        # the same weights and inputs: bf16 pipelines that differ in rounding, not in math
        assert abs(fused - eager) <= 0.01 * abs(eager), (row.part, fused, eager)
        if row.part == "step":  # k5l's loss is k5's: both from the unrounded float32 logits
            assert abs(by_name["fused-recomputed-logits"].loss - fused) <= 1e-6 * abs(fused), row.contenders
            # keep_act changes the backward only
            assert by_name["fused-kept-act"].loss == fused, row.contenders
        else:  # the block computes the layer's output too, with k0 where the layer has an addmm
            assert abs(by_name["fused-block"].loss - fused) <= 0.01 * abs(fused), row.contenders
            assert by_name["fused-block-kept-act"].loss == by_name["fused-block"].loss, row.contenders
        assert row.reps == 0 and not row.ratios and all(c.timing is None for c in row.contenders), "a CPU time reported"
        _same_gemms_as_eager(row)
    text = bt.render([report])
    step = report.rows[1].breakdown
    assert text.count("GEMM call (CPU) time by GEMM shape") == 2 and "| shape | fused | fused-recomputed-logits | fused-kept-act | eager |" in text
    assert (f"| total | {sum(g.ms for g in step['fused'].gemms):.2f} ({sum(g.launches for g in step['fused'].gemms)}) |"
            in text)


def _same_gemms_as_eager(row):
    """The CPU breakdown counts GEMM calls by shape: the fused model makes the eager one's
    GEMMs, shape by shape, except the recomputed LM-head GEMM in the backward of a step's
    fused-recomputed-logits contender, which the default fused model (stored logits) does not make."""
    c = row.config
    calls = {name: {g.shape: g.launches for g in b.gemms} for name, b in row.breakdown.items()}
    assert set(calls) == {"fused", "eager"} | ({"fused-recomputed-logits", "fused-kept-act"} if row.part == "step" else
                                               {"fused-block", "fused-block-kept-act"}), calls
    assert all(b.by_kind_ms == {} for b in row.breakdown.values())  # no GPU kernels on a CPU
    eager = calls["eager"]
    # per layer: QKV, O, gate/up, down; each forward, input-gradient and weight-gradient GEMM
    assert sum(eager.values()) == 12 * c.get("n_layers", 1) + (3 if row.part == "step" else 0), eager
    for name, got in calls.items():
        want = dict(eager)
        if name == "fused-recomputed-logits" and row.part == "step":
            lm_head = f"{max(c['tokens'], c['vocab'])} x {min(c['tokens'], c['vocab'])} x {c['d']}"
            want[lm_head] += 1
        assert got == want, (row.part, name, got, want)


def test_gemm_time_goes_to_the_op_that_launched_it():
    """On a GPU, each GEMM kernel counts at the shape of the nearest GEMM op around its
    launch: the launch call with the kernel's correlation id, placed in the op tree by its
    time (a fused GEMM's range, though the profiler linked the kernel to the custom op
    outside it), else the torch op the profiler linked it to (aten::mm / addmm / bmm);
    other kernels not at all; a GEMM kernel with neither under '?'. (Profiler events as
    torch.profiler makes them: torch ops link to nothing, launch calls and kernels to the
    torch op, and a kernel shares its launch call's id.)"""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from epiforge.primitives.epilogue import PROFILE_LABEL

    def op(i, name, shapes=(), parent=None, linked=0):
        e = FunctionEvent(id=i, name=name, thread=0, start_us=0, end_us=10, input_shapes=list(shapes),
                          use_device="cuda", linked_correlation_id=linked)
        if parent is not None:
            e.set_cpu_parent(parent)
            parent.append_cpu_child(e)
        return e

    def kernel(correlation, name, us, linked):
        return FunctionEvent(id=correlation, name=name, thread=0, start_us=100, end_us=100 + us, use_device="cuda",
                             device_type=DeviceType.CUDA, linked_correlation_id=linked)

    block = op(1, "epiforge::decoder_block_backward")
    fused = op(2, f"{PROFILE_LABEL} 16384x8192x2048 k7_dswiglu", parent=block)
    launch = op(501, "cuLaunchKernelEx", parent=fused, linked=1)  # CUPTI id 501; linked to the custom op
    zero = op(3, "aten::zero_", parent=fused)
    fill_launch = op(502, "cudaLaunchKernel", parent=zero, linked=3)
    linear = op(4, "aten::linear")
    mm = op(5, "aten::mm", shapes=[[16384, 2048], [2048, 8192]], parent=linear)
    wgrad = op(6, "aten::mm", shapes=[[8192, 16384], [16384, 2048]])
    bmm = op(7, "aten::bmm", shapes=[[4, 128, 64], [4, 64, 256]])
    stray = op(8, "triton_tem_fused_mm")
    kernels = [kernel(501, "kernel_cutlass_kernel_quackepilogue_x", 900.0, linked=1),
               kernel(502, "vectorized_elementwise_kernel<FillFunctor>", 50.0, linked=3),
               kernel(503, "nvjet_sm90_tst_128x256", 700.0, linked=5),  # no launch call recorded: by its link
               kernel(504, "nvjet_sm90_tst_256x128", 650.0, linked=6),
               kernel(505, "cutlass_80_gemm", 10.0, linked=7),
               kernel(506, "triton_tem_fused_mm_0_gemm", 30.0, linked=8)]
    # the GPU-side copy of the fused GEMM's range: a user annotation, not a kernel
    annotation = FunctionEvent(id=601, name=f"{PROFILE_LABEL} 16384x8192x2048 k7_dswiglu", thread=0, start_us=99,
                               end_us=1001, use_device="cuda", device_type=DeviceType.CUDA, is_user_annotation=True)
    events = [block, fused, launch, zero, fill_launch, linear, mm, wgrad, bmm, stray, *kernels, annotation]
    times = {g.shape: g for g in bt.gemm_times(events, on_gpu=True)}
    assert set(times) == {"16384 x 8192 x 2048", "8192 x 2048 x 16384", "512 x 256 x 64", "?"}, times
    # the fused GEMM (16384 x 8192, k 2048) and the unfused one it replaces are one shape
    both = times["16384 x 8192 x 2048"]
    assert both.launches == 2 and both.ms == pytest.approx(1.6) and both.by == ["aten::mm", "k7_dswiglu"]
    assert times["8192 x 2048 x 16384"].ms == pytest.approx(0.65)  # the fill kernel counted nowhere
    assert times["512 x 256 x 64"].launches == 1
    assert times["?"].by == ["triton_tem_fused_mm_0_gemm"] and times["?"].ms == pytest.approx(0.03)
    assert list(times) == ["16384 x 8192 x 2048", "8192 x 2048 x 16384", "?", "512 x 256 x 64"]  # largest first
    # rendered beside compile's, with the difference per shape: where the GEMM gap is
    compile_times = [bt.GemmTime(shape="16384 x 8192 x 2048", launches=1, ms=0.7, by=["aten::mm"]),
                     bt.GemmTime(shape="8192 x 2048 x 16384", launches=1, ms=0.65, by=["aten::mm"])]
    row = bt.Row(part="step", config={}, reps=10, contenders=[], breakdown={
        "fused": bt.Breakdown(by_kind_ms={}, top_kernels=[], gemms=list(times.values())),
        "compile": bt.Breakdown(by_kind_ms={}, top_kernels=[], gemms=compile_times)})
    table = "\n".join(bt.render_gemm_times(row))
    assert "| shape | fused | compile | fused - compile |" in table
    assert "| 16384 x 8192 x 2048 | 1.60 (2) | 0.70 (1) | +0.90 |" in table
    assert "| 512 x 256 x 64 | 0.01 (1) |  | +0.01 |" in table
    assert "| total | 2.29 (5) | 1.35 (2) | +0.94 |" in table
    # without the launch call, the kernel linked to the custom op has no GEMM op around it
    alone = {g.shape: g for g in bt.gemm_times([e for e in events if e is not launch], on_gpu=True)}
    assert alone["16384 x 8192 x 2048"].launches == 1 and "kernel_cutlass_kernel_quackepilogue_x" in alone["?"].by
    # torch 2.11's FunctionEvent has no linked_correlation_id: the launch call is known by its
    # name and id, the linked op by the kernel entry the profiler appended to it
    for e in events:
        del e.linked_correlation_id
    for o, k in ((zero, kernels[1]), (mm, kernels[2]), (wgrad, kernels[3]), (bmm, kernels[4]), (stray, kernels[5])):
        o.append_kernel(k.name, 0, k.device_time_total)
    block.append_kernel(kernels[0].name, 0, kernels[0].device_time_total)  # linked outside the range
    old_torch = {g.shape: g for g in bt.gemm_times(events, on_gpu=True)}
    assert old_torch == times
    alone = {g.shape: g for g in bt.gemm_times([e for e in events if e is not launch], on_gpu=True)}
    assert alone["16384 x 8192 x 2048"].launches == 1 and "kernel_cutlass_kernel_quackepilogue_x" in alone["?"].by
    zero.kernels.clear(); mm.kernels.clear()
    # what launched each kernel (profiler-linked): the outermost epiforge op, then the innermost op
    fill = op(9, "aten::fill_", parent=zero)
    fill.append_kernel("vectorized_elementwise_kernel<FillFunctor>", 0, 50.0)
    mm.append_kernel("nvjet_sm90_tst_128x256", 0, 700.0)
    launchers = bt.kernel_launchers([block, fused, zero, fill, mm])
    assert launchers["vectorized_elementwise_kernel<FillFunctor>"] == ["epiforge::decoder_block_backward > aten::fill_"]
    assert launchers["nvjet_sm90_tst_128x256"] == ["aten::mm"]


def test_a_cpu_run_without_tiny_is_refused(tmp_path, capsys):
    assert bt.main(["--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert "only --tiny" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.gpu
def test_the_liger_layer_computes_the_reference_layer():
    if bt._liger() is None:
        pytest.skip("liger_kernel is not installed")
    cfg = bt.LAYERS[2048]
    torch.manual_seed(0)
    ref = bt.ReferenceLlamaLayer(cfg, torch.float32, device="cuda")
    liger = bt.LigerLlamaLayer(cfg, {k: v.bfloat16() for k, v in ref.to_hf_state_dict().items()})
    x = torch.randn(2, 256, cfg.d, device="cuda")
    want = ref(x)
    got = liger(x.bfloat16()).float()
    rel = (got - want).norm() / want.norm()
    assert rel < 0.02, rel


def test_the_report_renders_the_committed_h200_step_with_its_ratios(capsys):
    """--report on the committed H200 step file: every contender, its time over the fused
    one's as the file's paired ratio (not a ratio of medians), the kernel breakdown."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "lab/results/h200/training/step.json"
    report = bt.Report.model_validate_json(path.read_text())
    assert bt.main(["--report", str(path)]) == 0
    text = capsys.readouterr().out
    row = report.rows[0]
    for k in row.contenders:
        assert f"| {k.name} |" in text
    r = row.ratios["compile/fused"]
    assert f"{r.median:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" in text
    assert "| contender | attention | gemm | optimizer | rest | total |" in text


def test_report_of_a_missing_file_is_one_line(tmp_path, capsys):
    assert bt.main(["--report", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.training:") and err.count("\n") == 1


def test_a_failed_profile_costs_its_breakdown_not_the_row():
    """A contender whose profiled call raises leaves the others' breakdowns and its reason
    in the row, and --report prints the reason."""
    def boom(_):
        raise RuntimeError("profiler said no")

    good = bt._Entry(bt.Contender(name="compile", what="x"), lambda _: torch.ones(4).sum(), lambda: 0)
    bad = bt._Entry(bt.Contender(name="fused", what="y"), boom, lambda: 0)
    row = bt.Row(part="step", config={}, reps=1, contenders=[good.record, bad.record])
    bt._breakdowns(row, [good, bad], ("fused", "compile"), cuda=False)
    assert set(row.breakdown) == {"compile"}
    assert row.breakdown_errors == {"fused": "RuntimeError: profiler said no"}


def test_the_weight_gradient_layouts_are_one_product():
    """bench.weight_grad_layouts times three operand orders of dW = G^T X, and quack's plain
    GEMM of the same transposed views at the tiles asked for: on a CPU (the emulator for
    quack's) they give the same values (the transposed view without a copy, the others
    contiguous), and the script refuses to run without a GPU in one line."""
    from lab.bench import weight_grad_layouts as wgl
    from lab.bench.configs import CANDIDATES

    g = torch.Generator().manual_seed(0)
    grad, x = torch.randn(96, 40, generator=g).bfloat16(), torch.randn(96, 24, generator=g).bfloat16()
    ways = {k: f() for k, f in wgl.variants(grad, x, [CANDIDATES[0], CANDIDATES[3]]).items()}
    assert sorted(k for k in ways if k.startswith("quack@")) == sorted(
        f"quack@{c.key()}" for c in (CANDIDATES[0], CANDIDATES[3]))
    want = grad.float().T @ x.float()
    for name, got in ways.items():
        assert got.shape == (40, 24) and torch.allclose(got.float(), want, rtol=2e-2, atol=2e-1), name
    assert ways["gt_x"].is_contiguous() and ways["xt_g_t_copy"].is_contiguous() and not ways["xt_g_t"].is_contiguous()
    if not torch.cuda.is_available():
        assert wgl.main(["--out", "/nonexistent/x.json"]) == 2


def test_clocks_sample_each_contender_alone_and_a_failure_is_its_own():
    """contender_clocks calls each named contender its number of times back to back under a
    clock sampler, in two passes (the second reversed), one summary per contender from both;
    a contender whose call raises gets that reason and the others go on. Without NVML (this
    machine, through the real eval.clocks sampler) nothing is called and each summary says why."""
    from epiforge.eval.clocks import ClockReading, summarize_readings
    from epiforge.eval.timing import summarize

    log = []

    def counted(name):
        def call(i):
            log.append(name)
            return torch.ones(4).sum()
        return call

    def boom(_):
        log.append("liger")
        raise RuntimeError("out of memory")

    class OneReading:
        """A sampler seam that reads one fixed clock per block (NVML does not run here)."""
        def __init__(self, index):
            self.readings, self.absent = [], None

        def __enter__(self):
            self.readings.append(ClockReading(1800.0 + 10 * len(log), 600_000.0, 60.0, 0))
            return self

        def __exit__(self, *exc):
            return False

    entries = [bt._Entry(bt.Contender(name=n, what=n), counted(n), lambda: 0) for n in ("compile", "fused")]
    entries.append(bt._Entry(bt.Contender(name="liger", what="z"), boom, lambda: 0))
    calls = {"fused": 2, "compile": 1, "liger": 3}
    clocks = bt.contender_clocks(entries, calls, sync=lambda: None, sampler=OneReading)
    assert log == ["fused", "fused", "compile", "liger", "compile", "fused", "fused"]  # liger's first call failed
    assert list(clocks) == ["fused", "compile", "liger"]
    assert clocks["liger"].absent == "its calls failed: RuntimeError: out of memory"
    assert clocks["fused"].samples == clocks["compile"].samples == 2
    assert clocks["fused"].sm_mhz_min == 1800.0 and clocks["fused"].sm_mhz_max == 1850.0  # passes 1 and 2 (5 calls before it)

    log.clear()  # the real sampler: NVML is absent on a CPU machine, so nothing runs
    real = bt.contender_clocks(entries, calls, sync=lambda: None)
    if all(c.absent for c in real.values()):
        assert log == [] and all("NVML" in c.absent or "nvml" in c.absent for c in real.values()), real
    # calls per pass: at least CLOCK_CALLS, else enough for CLOCK_PASS_S at the median time
    quick = bt._Entry(bt.Contender(name="q", what="q", timing=summarize([10_000.0] * 3)), boom, lambda: 0)
    slow = bt._Entry(bt.Contender(name="s", what="s", timing=summarize([400_000.0] * 3)), boom, lambda: 0)
    assert bt.clock_calls(quick) == 50 and bt.clock_calls(slow) == bt.CLOCK_CALLS == 3
    row = bt.Row(part="step", config={}, reps=1, contenders=[], clock_calls={"fused": 4},
                 clocks={"fused": summarize_readings([ClockReading(1755.0, 690_000.0, 60.0, 0x4),
                                                      ClockReading(1980.0, 650_000.0, 61.0, 0)])})
    assert bt.render_clocks(row)[2] == "- fused (4 calls a pass): SM 1868 MHz (1755-1980), 670 W, power-capped 50% " \
                                       "over 2 readings"


def test_host_time_is_the_median_call_and_the_report_sets_it_beside_the_median_time():
    import time as _time

    pauses = iter([0.001, 0.250, 0.050])  # ms 1, 250, 50: the median is the 50 ms call
    got = bt.host_time(lambda i: _time.sleep(next(pauses)), cuda=False, calls=3)
    assert 50.0 <= got.ms < 250.0 and got.calls == 3 and not got.waited
    row = bt.Row(part="layer", config={}, reps=1, contenders=[
        bt.Contender(name="fused", what="x", host=bt.HostTime(ms=12.5, calls=3, waited=False),
                     timing=bt.summarize([9000.0, 10000.0, 11000.0], keep=True)),
        bt.Contender(name="compile", what="y", host=bt.HostTime(ms=240.0, calls=3, waited=True)),
        bt.Contender(name="eager", what="z")])
    line = bt.render_host_times(row)[0]
    assert "fused 12.50 of 10.00" in line and "compile 240.00 (waited for the GPU)" in line and "eager" not in line
    with pytest.raises(ValueError):
        bt.HostTime(ms=1.0, calls=0, waited=False)


def _busy_host_work(n):
    total = 0
    for i in range(n):  # no call inside: all of it is this function's own time
        total += i * i
    return total


def test_host_time_profile_names_the_functions_that_took_the_host_time():
    got = bt.host_time(lambda i: (_busy_host_work(300_000), _busy_host_work(3_000)), cuda=False, calls=1,
                       profile_top=5)
    assert got.calls == 1 and len(got.by_function) <= 5
    where, ms = got.by_function[0]  # the heavier loop; the lighter one's own time is 100x less
    assert where.startswith("lab/tests/test_bench_training.py:") and where.endswith("(_busy_host_work)") and ms > 0, \
        got.by_function
    assert all("/work/" not in w and not w.startswith("/") for w, _ in got.by_function), got.by_function
    assert [m for _, m in got.by_function] == sorted((m for _, m in got.by_function), reverse=True)
    row = bt.Row(part="layer", config={}, reps=1, contenders=[bt.Contender(name="fused-block", what="x", host=got)])
    text = "\n".join(bt.render_host_times(row))
    assert "fused-block, the functions with the most own time" in text and where in text


@pytest.mark.gpu
def test_host_time_tells_a_call_that_queues_from_one_that_waits_for_the_gpu():
    x = torch.ones(1024, device="cuda")
    queued = bt.host_time(lambda i: x.mul_(1.0), cuda=True, calls=2, lead_cycles=200_000_000)
    synced = bt.host_time(lambda i: (x.mul_(1.0), torch.cuda.synchronize()), cuda=True, calls=2,
                          lead_cycles=200_000_000)
    assert not queued.waited and queued.ms < 20.0, queued
    assert synced.waited and synced.ms > queued.ms, synced
