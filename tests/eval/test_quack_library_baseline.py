"""quack's library alternatives (eval/quack_library.py, the quack_library baseline) compute
what their notes say: checked on the CPU through the emulator (torch twins of the library's
own epilogue functions) at a smoke shape."""

import pytest
import torch

from epiforge import tasks
from epiforge.eval.quack_library import alternatives
from epiforge.eval.numerics import references
from epiforge.tasks.tolerance import check_output

EXACT = ["k2_gemm_rmsnorm_swiglu", "k5_gemm_rmsnorm_partial_cross_entropy"]


def _inputs(name):
    task = tasks.get_task(name)
    dims = tasks.shape_sets()["smoke"][0].dims()
    return task, dims, task.make_inputs(dims, seed=3)


@pytest.mark.parametrize("name", EXACT)
def test_library_alternative_computes_the_task(name):
    task, dims, inputs = _inputs(name)
    exact, lowprec = references(task, inputs, dims)
    fn, note, _ = alternatives()[name]
    got = fn(dict(inputs), None)
    checks = {o.name: check_output(o, got.get(o.name), exact[o.name], lowprec[o.name]) for o in task.outputs}
    if "gathered" in note:
        # k5's library epilogue gathers the target logit from its stored bf16 logits: its loss
        # is off by that rounding, which a float32 output's tolerance rejects (fine to time)
        loss = checks.pop("loss")
        target_logit = (lowprec["lse"] - lowprec["loss"]).double()
        assert not loss.ok
        assert ((got["loss"].double() - lowprec["loss"].double()).abs() <= 2**-8 * target_logit.abs() + 1e-5).all()
    assert all(c.ok for c in checks.values()), [c.detail for c in checks.values() if not c.ok]
    assert "exactly" in note or "gathered" in note


def test_rms_bwd_apply_alternative_is_the_deferred_backward():
    task, dims, inputs = _inputs("k6_gemm_residual_partial_rmsnorm_bwd")
    fn, note, _ = alternatives()[task.name]
    out = fn(dict(inputs), None)
    f64 = {k: v.double() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    g = f64["dz"] @ f64["w_gu"]
    corr = -(f64["rstd"] ** 2) * f64["zdz"] / dims["d"]
    dx = g * f64["norm_weight"] + f64["dx_in"] + f64["x"] * corr[:, None]
    dw = (g * f64["x"]).sum(0)
    assert (out["dx"].double() - dx).abs().max() <= 2e-2 * dx.abs().max()
    assert (out["dw"].double() - dw).abs().max() <= 1e-3 * dw.abs().max()
    assert "h" not in out and "deferred" in note and "does not store h" in note


def test_alternatives_cover_our_own_kernels_except_k1():
    ours = {t.name for t in tasks.load_catalogue()[0] if t.id in ("k1", "k2", "k5", "k6")}
    assert set(alternatives()) == ours - {"k1_gemm_rmsnorm"}


def test_diagnostics_do_the_task_minus_one_piece():
    """k7 without ZdZ gives k7's dz and out, without postact its dz; k0 without the sum of
    squares gives k0's h (and y * w where k0 stores y); k6 without h gives k6's dx and dw: on
    the CPU, through the torch twins of quack's own functions."""
    from epiforge.eval.quack_library import DIAGNOSTICS

    for name, diag, expect in (("k7_gemm_partial_swiglu_bwd", "without_zdz", {"dz": "dz", "out": "out"}),
                               ("k7_gemm_partial_swiglu_bwd", "without_postact", {"dz": "dz"}),
                               ("k0_gemm_residual_partial_rmsnorm", "without_sumsq", {"h": "h"}),
                               ("k6_gemm_residual_partial_rmsnorm_bwd", "without_h", {"dx": "dx", "dw": "dw"})):
        task, dims, inputs = _inputs(name)
        exact, lowprec = references(task, inputs, dims)
        fn, note = DIAGNOSTICS[name][diag]
        got = fn(dict(inputs), None)
        checks = {o.name: o for o in task.outputs}
        from epiforge.tasks.tolerance import check_output

        for out_name, ref_name in expect.items():
            c = check_output(checks[ref_name], got[out_name], exact[ref_name], lowprec[ref_name])
            assert c.ok, (name, out_name, c.detail)
        assert "without" in note
    task, dims, inputs = _inputs("k0_gemm_residual_partial_rmsnorm")
    got = DIAGNOSTICS[task.name]["without_sumsq"][0](dict(inputs), None)
    exact, _ = references(task, inputs, dims)
    y_w = exact["x"].double() * inputs["norm_weight"].double()
    assert (got["x_times_w"].double() - y_w).abs().max() <= 2e-2 * y_w.abs().max()


def test_stores_only_diagnostics_store_the_kernels_bytes_without_c():
    """k7's stores are three (M, F) bf16 tensors (dz is (M, 2F)), k0's two (M, d): the
    synthetic stand-ins write exactly that many bytes, each a multiple of the GEMM."""
    from epiforge.eval.quack_library import DIAGNOSTICS

    for name, got_names, ref in (("k7_gemm_partial_swiglu_bwd", ("D", "a", "b"), ("dz", "out")),
                                 ("k0_gemm_residual_partial_rmsnorm", ("D", "a"), ("h", "x"))):
        task, dims, inputs = _inputs(name)
        exact, _ = references(task, inputs, dims)
        got = DIAGNOSTICS[name]["stores_only"][0](dict(inputs), None)
        assert set(got) == set(got_names)
        stored = sum(t.numel() * t.element_size() for t in got.values())
        assert stored == sum(exact[r].numel() * 2 for r in ref), name  # the kernel stores bf16
        a, w = (inputs["dout"], inputs["w_down"].T) if name.startswith("k7") else (inputs["a"], inputs["w_o"])
        gemm = a.double() @ w.double().T
        for i, t in enumerate(got.values()):
            assert t.dtype == torch.bfloat16
            assert (t.double() - (i + 1) * gemm).abs().max() <= 1e-2 * (i + 1) * gemm.abs().max()


def test_c_and_stores_diagnostic_moves_k7s_bytes_with_the_lightest_math():
    """k7's floor at fixed I/O: it reads the packed (gate, up) C and writes dz's shape and
    dtype plus postact's, each value one product (acc * up, acc * gate, gate * up)."""
    from epiforge.eval.quack_library import DIAGNOSTICS

    task, dims, inputs = _inputs("k7_gemm_partial_swiglu_bwd")
    exact, _ = references(task, inputs, dims)
    fn, note = DIAGNOSTICS[task.name]["c_and_stores"]
    got = fn(dict(inputs), None)
    assert set(got) == {"dz", "out"} and "no reduction" in note
    for name in ("dz", "out"):
        assert got[name].shape == exact[name].shape and got[name].dtype == torch.bfloat16
    acc = inputs["dout"].double() @ inputs["w_down"].double()
    gate, up = inputs["z"].double()[:, 0::2], inputs["z"].double()[:, 1::2]
    dz = torch.stack((acc * up, acc * gate), -1).reshape(acc.shape[0], -1)
    for t, ref in ((got["dz"], dz), (got["out"], gate * up)):
        assert (t.double() - ref).abs().max() <= 1e-2 * ref.abs().max()
