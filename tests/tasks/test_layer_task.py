"""The task of several GEMMs (issue 15 section 5): the whole non-attention part of a LLaMA
decoder layer, forward and backward, as one task the agent can be asked to write. Its written
backward against torch.autograd; the spec's GEMMs, their operands and the hidden shapes they
need; the launch check's allowance of 12 fused GEMMs; spec errors of such tasks; a kernel
wrong in one step fails; the judge's timed stages (the GEMM-only sequence) on a CPU."""

import re
import time
from pathlib import Path

import pytest
import torch

from epiforge import tasks
from epiforge.eval import evaluate, gpu_stages, numerics
from epiforge.eval.launches import Launch, classify, classify_recorded
from epiforge.eval.plausibility import Ceilings
from epiforge.eval.remote import KernelProcess
from epiforge.eval.secret_shapes import hidden_shapes
from epiforge.tasks import common
from epiforge.tasks.layer_non_attention_fwd_bwd import reference as layer_ref
from epiforge.tasks.spec import TaskError, load_task_file

REPO = Path(__file__).resolve().parents[2]
TASK = tasks.get_task("layer")
EXPERT = REPO / "human_kernels" / f"{TASK.name}.py"
#: input -> the output that is its gradient
GRADIENTS = {"attn": "d_attn", "x": "dx", "w_o": "dw_o", "post_norm": "d_post_norm", "w_gu": "dw_gu",
             "w_down": "dw_down", "next_norm": "d_next_norm", "w_qkv": "dw_qkv"}


def test_the_written_backward_is_autograds():
    """The reference's backward (the k6 / k7 chain, ZdZ and all) against torch.autograd of its
    own forward, both in float64: the gradients of every input and weight agree to rounding."""
    dims = tasks.shape_sets()["smoke"][1].dims()
    inputs = TASK.make_inputs(dims, seed=3)
    wide = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    leaves = {k: wide[k].clone().requires_grad_(True) for k in GRADIENTS}
    fw = layer_ref.forward({**wide, **leaves}, dims, mm=torch.matmul)
    ((fw["qkv"] * wide["dqkv"]).sum() + (fw["y"] * wide["dy"]).sum()).backward()
    written = layer_ref.reference(wide, dims, mm=torch.matmul)
    for name, out in GRADIENTS.items():
        want = leaves[name].grad
        assert (written[out] - want).abs().max() <= 1e-12 * want.abs().max(), out
    assert torch.equal(written["y"], fw["y"]) and torch.equal(written["qkv"], fw["qkv"])


def test_the_reference_stores_where_the_expert_kernel_stores():
    """The low-precision reference rounds a tensor to bf16 exactly where a fused pipeline
    writes it and reads it back (its `store`s). Then the expert kernel on the emulator (the
    same float32 epilogues, the same stores) gives bit for bit the reference's values but
    where a stored intermediate fell the other way of a rounding boundary: few elements of a
    bf16 output differ, by less than the reference's own error. A store missing or misplaced
    in the reference makes most of them differ."""
    from epiforge.tasks.tolerance_margins import load_expert, run_expert

    module = load_expert(TASK)
    dims = tasks.shape_sets()["smoke"][0].dims()
    inputs = TASK.make_inputs(dims, seed=7)
    got = run_expert(TASK, module, inputs)
    low, exact = TASK.reference(inputs, dims, exact=False), TASK.reference(inputs, dims, exact=True)
    for o in TASK.outputs:
        diff = (got[o.name].double() - low[o.name].double()).abs()
        own = (low[o.name].double() - exact[o.name]).abs().max()
        if o.dtype == "bfloat16":
            assert (diff > 0).double().mean() < 0.1 and diff.max() < 1.5 * own, o.name
        else:  # a float32 sum: the order of its float32 additions differs everywhere, by little
            assert diff.max() < 0.2 * own, o.name
    # the check has teeth: the same reference storing nothing (every intermediate float32)
    # differs from the kernel almost everywhere
    widened = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in TASK.gemm_operand_inputs
               else v for k, v in inputs.items()}
    unstored = TASK._run_reference(widened, dims, mm=common.mm, store=common.keep)
    assert (unstored["dw_qkv"].bfloat16().double() != got["dw_qkv"].double()).double().mean() > 0.5


def test_the_gemms_their_operands_and_the_hidden_shapes_they_need():
    dims = tasks.shape_sets()["smoke"][0].dims()
    M, d, F = dims["M"], dims["d"], dims["F"]
    assert TASK.gemm_count == 12 and TASK.gemm is None and TASK.tokens_in_rows
    assert TASK.finishing_steps == ["rstd_from_sumsq", "rstd_from_sumsq", "rope_backward", "col_sum", "row_sum",
                                    "col_sum"]
    shapes = dict(zip(TASK.gemms, TASK.gemm_shapes(dims)))
    assert shapes["qkv"] == (M, 3 * d, d) and shapes["down_dgrad"] == (M, F, d) and shapes["gate_up_wgrad"] == (2 * F, d, M)
    # forward, dgrads and weight gradients: each of the four weights is read by three GEMMs
    assert TASK.flops(dims) == 6 * M * (d * d + 2 * F * d + d * F + 3 * d * d)
    inputs = TASK.make_inputs(dims, seed=1)
    sets = TASK.gemm_operand_sets(inputs, dims)
    for (name, (m, n, k)), (a, b) in zip(shapes.items(), sets):
        assert a.shape == (m, k) and b.shape == (n, k) and a.dtype == b.dtype == torch.bfloat16, name
        assert a.is_contiguous() == (TASK.gemms[name].a_layout == "mk"), name  # "km": a transposed view
    assert sets[0][0] is inputs["attn"] and sets[-1][1].data_ptr() == inputs["attn"].data_ptr()  # inputs as given
    names = list(TASK.gemms)
    dgrad, wgrad = sets[names.index("qkv_dgrad")][0], sets[names.index("qkv_wgrad")][0]
    assert wgrad.data_ptr() == dgrad.data_ptr() and torch.equal(wgrad, dgrad.T)  # one dz_qkv, read both ways
    again = TASK.gemm_operand_sets(TASK.make_inputs(dims, seed=1), dims)
    assert all(torch.equal(a, a2) and torch.equal(b, b2) for (a, b), (a2, b2) in zip(sets, again))
    with pytest.raises(TaskError, match="12 GEMMs"):
        TASK.gemm_shape(dims)
    # a weight gradient's K is the token count: the GPU needs it a multiple of 8 (16-byte rows),
    # so the hidden shapes of such a task draw M so (still no whole tile); the others' are as before
    for seed in range(40):
        for s in hidden_shapes("smoke", seed, tokens_in_rows=True):
            assert s.M % 8 == 0 and s.M % 64 and s.M % s.seq == 0
        assert hidden_shapes("smoke", seed) == hidden_shapes("smoke", seed, tokens_in_rows=False)
    assert any(s.M % 8 for seed in range(40) for s in hidden_shapes("smoke", seed))


def test_the_launch_check_allows_exactly_its_gemms_and_steps():
    fused = [f"gemm:e{i}@128x128_c1x1" for i in range(12)]
    steps = [f"finish:{s}" for s in TASK.finishing_steps]
    assert classify_recorded(fused + steps, TASK.launches)[0]
    ok, line = classify_recorded(fused[:11] + steps, TASK.launches)
    assert not ok and "11 fused GEMMs" in line and "exactly 12 are allowed" in line
    assert not classify_recorded(fused + ["gemm:extra@128x128_c1x1"] + steps, TASK.launches)[0]
    ok, line = classify_recorded(fused + steps + ["finish:rope_backward"], TASK.launches)
    assert not ok and "rope_backward" in line  # a step once more than listed is a launch too many
    gemm = "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_plain_0"
    kernels = [Launch(gemm)] * 12 + [Launch(n) for n in ("_row_fold", "_row_fold", "_rope_bwd", "_col_fold", "_row_fold",
                                                         "_col_fold")]
    assert classify(kernels, TASK.launches).ok
    assert not classify(kernels[1:], TASK.launches).ok
    assert not classify([*kernels, Launch("elementwise_kernel")], TASK.launches).ok


ONE_IN_GEMMS = """id = "layer"
name = "layer_non_attention_fwd_bwd"
title = "one GEMM under [gemms]"
description = "y = a @ w^T"
launches = ["gemm:only"]

[gemms.only]
m = "M"
n = "d"
k = "d"
a = "a"
b = "w"

[[inputs]]
name = "a"
shape = ["M", "d"]
dtype = "bfloat16"
description = "a"

[[inputs]]
name = "w"
shape = ["d", "d"]
dtype = "bfloat16"
description = "w"

[[outputs]]
name = "y"
shape = ["M", "d"]
dtype = "bfloat16"
description = "y"
"""


def _spec(tmp_path, text: str) -> Path:
    path = tmp_path / "x" / TASK.name / "task.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (path.parent / "reference.py").write_text((TASK.folder / "reference.py").read_text())
    return path


@pytest.mark.parametrize("edit,fragment", [
    (lambda s: s.replace('"gemm:o_wgrad"]', '"gemm:o_wgrad", "gemm:o_wgrad"]'), "name each of gemms once"),
    (lambda s: re.sub(r',\s*"gemm:o_wgrad"\]', "]", s), "name each of gemms once"),
    (lambda s: s.replace('launches = ["gemm:o_proj"', 'launches = ["gemm", "gemm:o_proj"'), "name each of gemms once"),
    (lambda s: s + '\n[gemm]\nm = "M"\nn = "d"\nk = "d"\na = "attn"\nb = "w_o"\n', "not both or neither"),
    (lambda s: ONE_IN_GEMMS, "a task of one GEMM gives it as [gemm]"),
    (lambda s: s.replace("[gemms.o_wgrad]\nm = \"d\"\nn = \"d\"\nk = \"M\"", "[gemms.o_wgrad]\nm = \"d\"\nn = \"d\"\nk = \"M + 1\""),
     "not a multiple of 8"),
    (lambda s: s.replace('a_layout = "km"', 'a_layout = "mn"', 1), "a_layout"),
])
def test_spec_errors_of_a_task_of_several_gemms_are_one_line(tmp_path, edit, fragment):
    text = edit((TASK.folder / "task.toml").read_text())
    with pytest.raises(TaskError) as err:
        load_task_file(_spec(tmp_path, text))
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.spawns
def test_a_kernel_that_rotates_back_the_wrong_way_fails(tmp_path):
    """The expert kernel with RoPE's backward in the forward's direction (the rotation not
    undone): INCORRECT_NUMERICS, the forward outputs still right."""
    src = EXPERT.read_text().replace("2 * d,\n                                          ROPE_DIRECTION)",
                                     "2 * d,\n                                          -ROPE_DIRECTION)")
    assert src != EXPERT.read_text()
    kernel = tmp_path / "layer_wrong_rope_bwd.py"
    kernel.write_text(src)
    r = evaluate("layer", str(kernel), seed=2)
    assert r.outcome.value == "INCORRECT_NUMERICS", r.message
    checks = {c.name: c.ok for c in r.per_shape[0].outputs}
    assert checks["y"] and checks["qkv"] and not checks["dw_qkv"]


@pytest.mark.spawns
def test_a_weight_gradient_left_to_torch_is_caught(tmp_path):
    """One weight gradient as torch.matmul instead of a fused GEMM: the static rules reject
    it; behind them (rules off) the CPU's launch check sees 11 fused GEMMs and a torch
    matmul in run(): EXTRA_LAUNCHES."""
    cheat = EXPERT.read_text().replace('dw_o": plain(dx.T, attn.T)["D"]', 'dw_o": torch.matmul(dx.T, attn)').replace(
        "import primitives as P\n", "import torch\n\nimport primitives as P\n")
    assert cheat != EXPERT.read_text()
    kernel = tmp_path / "layer_torch_wgrad.py"
    kernel.write_text(cheat)
    assert evaluate("layer", str(kernel), seed=2).outcome.value == "STATIC_REJECTED"
    r = evaluate("layer", str(kernel), seed=2, static_checks=False)
    assert r.outcome.value == "EXTRA_LAUNCHES", r.message


@pytest.mark.spawns
def test_the_timed_stages_time_the_gemm_only_sequence(tmp_path):
    """The judge's timed phase driven on a CPU for the task of 12 GEMMs: the launch check
    counts 12, and the speed of light is the fastest whole sequence of plain GEMMs (cuBLAS for
    each, quack's identity GEMM for each at its fastest known config, or each by the faster of
    the two)."""
    shape = tasks.shape_sets()["smoke"][1]
    kp = KernelProcess(tmp_path / "runner", deadline=time.monotonic() + 600)
    try:
        kp.ask({"op": "load", "path": str(EXPERT), "device": "cpu"}, stage="load")
        res = numerics.check_shape(TASK, kp, shape, 5, 1, "cpu")
        assert res.outcome.value == "PASSED", res.message
        stages = []
        gpu_stages.run_gpu_stages(TASK, kp, shape, res, 5, 1, stage=stages.append, ceilings=Ceilings(), reps=4,
                                  warmup=1, shapes_name="smoke", device="cpu")
    finally:
        kp.close()
    assert res.outcome.value == "PASSED" and stages[-1] == "plausibility", res.message
    t = res.timing
    assert set(t.baselines) >= {"cublas", "quack_gemm@fastest_known", "gemm_mixed", "gemm_only", "eager"}
    assert "12 GEMMs" in t.notes["cublas"] and t.notes["gemm_only"].startswith("the speed of light: ")
    assert sum(x.startswith("gemm:") for x in res.launches) == 12
