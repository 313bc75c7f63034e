"""The task catalogue: specs load and validate, shapes follow the paper, references and
input makers agree with the specs, the tolerance rule catches what it must."""

import math

import pytest
import torch

import tasks
from tasks.spec import TaskError, load_task_file
from tasks.tolerance import check_output

CATALOGUE, ERRORS = tasks.load_catalogue()


def test_ten_tasks_load():
    assert ERRORS == []
    assert [t.id for t in CATALOGUE] == [f"k{i}" for i in range(10)]


def test_shape_sets_follow_the_paper():
    sets = tasks.shape_sets()
    assert [s.d for s in sets["paper"]] == [2048, 4096, 8192]
    for s in sets["paper"] + sets["smoke"]:
        assert s.F == math.ceil(8 * s.d / 3 / 256) * 256  # F = round_up(8d/3, 256)
    assert all(s.M == 16384 and s.V == 32768 for s in sets["paper"])


@pytest.mark.parametrize("task", CATALOGUE, ids=lambda t: t.id)
def test_inputs_and_references_match_the_spec(task):
    for shape in tasks.shape_sets()["smoke"]:
        dims = shape.dims()
        inputs = task.make_inputs(dims, seed=3)  # checks shapes and dtypes itself
        again = task.make_inputs(dims, seed=3)
        assert all(torch.equal(inputs[t.name], again[t.name]) for t in task.inputs), "seeded maker is not reproducible"
        exact = task.reference(inputs, dims, exact=True)
        low = task.reference(inputs, dims, exact=False)
        for o in task.outputs:
            want = o.concrete_shape(dims)
            assert tuple(exact[o.name].shape) == want and tuple(low[o.name].shape) == want
            assert low[o.name].dtype == o.torch_dtype
            assert torch.isfinite(exact[o.name]).all()
            # the low-precision reference (float32 computation, one rounding) is less precise
            # than the exact one (else the tolerance would be atol only)
            assert (low[o.name].double() - exact[o.name].double()).abs().max() > 0


@pytest.mark.parametrize("task", CATALOGUE, ids=lambda t: t.id)
def test_unfused_is_the_plain_pipeline_not_the_reference(task):
    """Task.unfused (the timed eager / torch.compile baseline) is the reference code with
    plain `@` on the inputs as given, as bench/run.py compiles it; the tolerance's
    low-precision reference is more precise on every float32 output (one rounding, float32
    reductions) and no less precise on any output."""
    dims = tasks.shape_sets()["smoke"][0].dims()
    inputs = task.make_inputs(dims, seed=4)
    plain = task._module.reference(inputs, dims)
    unfused = task.unfused(inputs, dims)
    exact = task.reference(inputs, dims, exact=True)
    low = task.reference(inputs, dims, exact=False)
    for o in task.outputs:
        assert torch.equal(unfused[o.name], plain[o.name].to(o.torch_dtype))
        unfused_err = (unfused[o.name].double() - exact[o.name]).abs().max()
        low_err = (low[o.name].double() - exact[o.name]).abs().max()
        assert low_err <= unfused_err
        if o.dtype == "float32":
            assert low_err < 1e-2 * unfused_err
    if task.id == "k8":  # z is the GEMM alone: unfused, the bf16 GEMM as cuBLAS would give it
        assert torch.equal(unfused["z"], inputs["a"] @ inputs["w_gu"].T)


def test_inputs_have_realistic_scales():
    task = tasks.get_task("k6")
    dims = tasks.shape_sets()["smoke"][0].dims()
    x = task.make_inputs(dims, seed=0)
    # rstd is the real 1/rms of the residual stream the task hands over
    assert torch.allclose(x["rstd"], torch.rsqrt(x["x"].float().pow(2).mean(-1) + 1e-6), rtol=1e-5)
    w = x["w_gu"].float()
    assert 0.5 < w.std().item() * math.sqrt(w.shape[1]) < 2.0
    k9 = tasks.get_task("k9").make_inputs(dims, seed=0)
    assert int(k9["targets"].min()) >= 0 and int(k9["targets"].max()) < dims["V"]
    k3 = tasks.get_task("k3").make_inputs(dims, seed=0)
    assert k3["positions"].max().item() == dims["seq"] - 1


def test_roofline_numbers():
    k9 = tasks.get_task("k9")
    dims = tasks.shape_sets()["paper"][0].dims()
    assert k9.flops(dims) == 2 * 16384 * 32768 * 2048
    # logits never reach memory: a, w_lm, targets in; loss, lse out
    assert k9.min_bytes(dims) == 16384 * 2048 * 2 + 32768 * 2048 * 2 + 16384 * 8 + 2 * 16384 * 4


def test_lookup_by_id_and_unknown_name():
    assert tasks.get_task("k7").name == "k7_gemm_partial_swiglu_bwd"
    with pytest.raises(TaskError, match="unknown task 'k42'"):
        tasks.get_task("k42")


def _write_spec(tmp_path, text):
    folder = tmp_path / "k0_gemm_residual_partial_rmsnorm"
    folder.mkdir()
    (folder / "task.toml").write_text(text)
    return folder / "task.toml"


def test_malformed_spec_is_one_line_naming_file_and_field(tmp_path):
    good = (tasks.spec.TASKS_DIR / "k0_gemm_residual_partial_rmsnorm" / "task.toml").read_text()
    bad = good.replace('dtype = "float32"', 'dtype = "float31"')
    path = _write_spec(tmp_path, bad)
    with pytest.raises(TaskError) as err:
        load_task_file(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "outputs.2.dtype" in msg


def test_spec_errors_cover_unknown_dims_launches_and_toml(tmp_path):
    good = (tasks.spec.TASKS_DIR / "k0_gemm_residual_partial_rmsnorm" / "task.toml").read_text()
    for broken, field in [
        (good.replace('shape = ["M", "d"]', 'shape = ["M", "hidden"]', 1), "inputs.0.shape"),
        (good.replace('"rstd_from_sumsq"', '"magic_step"'), "launches"),
        (good + "\nunexpected_key = 1\n", "unexpected_key"),
        ("id = ", "not valid TOML"),
    ]:
        path = tmp_path / "x" / "k0_gemm_residual_partial_rmsnorm" / "task.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(broken)
        with pytest.raises(TaskError) as err:
            load_task_file(path)
        assert field in str(err.value) and "\n" not in str(err.value)


def test_a_broken_spec_does_not_hide_the_others(tmp_path, monkeypatch):
    import shutil

    for t in CATALOGUE[:3]:
        shutil.copytree(t.folder, tmp_path / t.folder.name)
    (tmp_path / CATALOGUE[1].folder.name / "task.toml").write_text("id = 'k1'\n")
    monkeypatch.setattr(tasks, "TASKS_DIR", tmp_path)
    loaded, errors = tasks.load_catalogue()
    assert [t.id for t in loaded] == ["k0", "k2"]
    assert len(errors) == 1 and "k1_gemm_rmsnorm" in errors[0]


def test_tolerance_rule():
    spec = tasks.get_task("k1").outputs[0]
    exact = torch.linspace(-3, 3, 64, dtype=torch.float64).reshape(4, 16)
    low = exact.to(torch.bfloat16)
    good = exact.to(torch.bfloat16)
    assert check_output(spec, good, exact, low).ok
    off = good.clone()
    off[2, 5] += 0.25
    res = check_output(spec, off, exact, low)
    assert not res.ok and res.problem == "tolerance" and res.worst_index == [2, 5]
    nan = good.clone()
    nan[1, 1] = float("nan")
    assert check_output(spec, nan, exact, low).problem == "nonfinite"
    assert check_output(spec, good.float(), exact, low).problem == "dtype"
    assert check_output(spec, good[:3], exact, low).problem == "shape"



def test_rms_guard_catches_a_systematic_error_the_max_rule_misses():
    spec = tasks.get_task("k0").outputs[2]  # rstd: float32
    exact = torch.full((1000,), 0.5, dtype=torch.float64)
    exact[0] = 8.1  # low precision's error is peaky: large on one element, tiny in RMS
    low = exact.to(torch.bfloat16)
    biased = (exact + 0.01).float()  # every element off by 0.01
    res = check_output(spec, biased, exact, low)
    assert res.max_error <= res.allowed and res.problem == "rms" and not res.ok
    assert check_output(spec, exact.float(), exact, low).ok
