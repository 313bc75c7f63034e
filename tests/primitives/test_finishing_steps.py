"""The finishing steps are an open registry (primitives/finish.py): a task adds its own in a
finishing.py beside its reference.py; the CPU evaluation checks the task's list of steps as
the GPU's launch check does, and a bad registration or a broken finishing.py is one line."""

import textwrap

import pytest
import torch

from epiforge import primitives as P
from epiforge import tasks
from epiforge.eval import evaluate
from epiforge.eval.launches import Launch, classify

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

FINISHING = '''
import primitives as P


def _row_max_cpu(partials):
    return partials.amax(dim=-1)


def _row_max_gpu(partials):  # a test task's lowering: torch's own reduction kernel
    return partials.amax(dim=-1)


P.finish.register("row_max", "out[m] = max_t partials[m, t]", cpu=_row_max_cpu, gpu=_row_max_gpu,
                  gpu_kernel="reduce_kernel")
'''

TOML = '''
id = "x2"
name = "x2_gemm_row_max"
title = "GEMM + the max of each row"
description = "out[m] = max_n (a @ w^T)[m, n], folded from per-tile maxima by a finishing step of the task's own."
launches = ["gemm", "row_max"]

[gemm]
m = "M"
n = "F"
k = "d"
a = "a"
b = "w"
b_layout = "nk"

[[inputs]]
name = "a"
shape = ["M", "d"]
dtype = "bfloat16"
description = "activations"

[[inputs]]
name = "w"
shape = ["F", "d"]
dtype = "bfloat16"
constant = true
description = "weight"

[[outputs]]
name = "row_max"
shape = ["M"]
dtype = "float32"
description = "each row's largest logit"
'''

REFERENCE = '''
from tasks import common


def make_inputs(dims, gen, device):
    return {"a": common.normal((dims["M"], dims["d"]), gen, device),
            "w": (common.normal((dims["F"], dims["d"]), gen, device) * 0.1).bfloat16()}


def reference(inputs, dims, mm=None):
    return {"row_max": (mm or common.mm)(inputs["a"], inputs["w"].T).amax(dim=-1)}
'''

KERNEL = '''
import primitives as P

TASK = "x2_gemm_row_max"


@P.epilogue(reductions={"mx": P.RowReduce(combine="max")})
def row_max_epi(acc):
    return {"mx": acc}


def run(inputs, prepared, config=None):
    out = row_max_epi(inputs["a"], inputs["w"], store_d=False, config=config)
%s    return {"row_max": P.finish.row_max(out["mx"])}
'''


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    root = tmp_path / "tasks"
    folder = root / "x2_gemm_row_max"
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(TOML)
    (folder / "reference.py").write_text(REFERENCE)
    (folder / "finishing.py").write_text(FINISHING)
    monkeypatch.setenv("EPIFORGE_TASKS_PATH", str(root))
    return folder


def test_a_tasks_own_step_is_registered_documented_and_judged_on_the_cpu(task_dir, tmp_path):
    task = tasks.get_task("x2")
    assert task.launches == ["gemm", "row_max"] and "row_max" in P.finish.FINISHERS
    honest = tmp_path / "x2_honest.py"
    honest.write_text(KERNEL % "")
    res = evaluate("x2", honest, device="cpu", shapes="smoke", seed=3)
    assert res.passed, res.message
    twice = tmp_path / "x2_twice.py"  # the step launched once more than the task allows
    twice.write_text(KERNEL % '    spare = P.finish.row_max(out["mx"])\n')
    res = evaluate("x2", twice, device="cpu", shapes="smoke", seed=3)
    assert res.outcome.value == "EXTRA_LAUNCHES" and "row_max" in res.message
    # the GPU's launch check counts the step's own kernel name, once
    allowed = ["gemm", "row_max"]
    gemm = Launch("kernel_cutlass_kernel_quackepiloguefrontendGemmMod_row_max_epi_0")
    assert classify([gemm, Launch("reduce_kernel")], allowed).ok
    assert not classify([gemm, Launch("reduce_kernel"), Launch("reduce_kernel")], allowed).ok


def test_an_unknown_step_or_a_broken_finishing_module_is_one_line_and_the_others_still_list(task_dir):
    (task_dir / "finishing.py").write_text("raise RuntimeError('half-written')\n")
    listed, errors = tasks.load_catalogue()
    assert "x2_gemm_row_max" not in {t.name for t in listed} and "k0_gemm_residual_partial_rmsnorm" in {
        t.name for t in listed}
    (line,) = [e for e in errors if "x2_gemm_row_max" in e]
    assert "finishing.py" in line and "half-written" in line and "\n" not in line
    (task_dir / "finishing.py").unlink()
    (task_dir / "task.toml").write_text(TOML.replace('"row_max"]', '"row_min"]'))
    (line,) = [e for e in tasks.load_catalogue()[1] if "x2_gemm_row_max" in e]
    assert "unknown finishing step(s) ['row_min']" in line and "launches" in line


def test_the_registry_refuses_clashes_and_bad_names():
    def cpu(p):
        return p.sum(-1)

    with pytest.raises(ValueError, match="already registered"):
        P.finish.register("row_sum", "a second row_sum", cpu=cpu, gpu=cpu, gpu_kernel="k")
    with pytest.raises(ValueError, match="plain identifier"):
        P.finish.register("row-sum", "", cpu=cpu, gpu=cpu, gpu_kernel="k")
    with pytest.raises(ValueError, match="taken by primitives.finish"):
        P.finish.register("register", "", cpu=cpu, gpu=cpu, gpu_kernel="k")
    with pytest.raises(AttributeError, match="no finishing step 'nothing'"):
        P.finish.nothing(torch.zeros(2, 2))
    # a fold takes only what a fused GEMM's reduction wrote (issue 42: full-width logits handed to
    # cross_entropy made the step do the task's work)
    with pytest.raises(ValueError, match="reduction's output of a fused GEMM"):
        P.finish.row_sum(torch.ones(3, 4))


def test_the_builtin_gpu_lowerings_compute_what_the_cpu_steps_do():
    """finish_gpu's Triton kernels under Triton's interpreter (CPU tensors), against the
    registered CPU functions: the two sides of each built-in step agree."""
    import os
    import subprocess
    import sys

    code = textwrap.dedent('''
        import torch
        from epiforge.primitives import finish, finish_gpu
        p, t = torch.randn(37, 5), torch.randn(37)
        pairs = [(finish_gpu.row_sum(p), finish.STEPS["row_sum"].cpu(p)),
                 (finish_gpu.col_sum(p), finish.STEPS["col_sum"].cpu(p)),
                 (finish_gpu.rstd_from_sumsq(p.abs(), 8, 1e-6), finish.STEPS["rstd_from_sumsq"].cpu(p.abs(), 8, 1e-6)),
                 *zip(finish_gpu.cross_entropy(p, t), finish.STEPS["cross_entropy"].cpu(p, t))]
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in pairs), [(a - b).abs().max() for a, b in pairs]
        print("agree")
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0 and "agree" in out.stdout, out.stderr[-2000:]


def test_rope_backward_undoes_the_rotation_and_sums_zdz():
    """rope_backward (the one built-in step that is no fold): on the CPU and as its Triton
    kernel under the interpreter, dz rotated forward again is dqkv (to bf16 rounding), zdz is
    the sum over the projection before RoPE (the rotation is orthogonal), the columns past
    rotary_cols pass through, in both directions; bad arguments are one ValueError."""
    import os
    import subprocess
    import sys

    code = textwrap.dedent('''
        import torch
        from epiforge.primitives import finish, finish_gpu
        from epiforge.tasks import common
        g = torch.Generator().manual_seed(0)
        m, d, hd = 37, 256, 128
        z = torch.randn(m, 3 * d, generator=g, dtype=torch.float64)  # the projection before RoPE
        dqkv = torch.randn(m, 3 * d, generator=g).to(torch.bfloat16)
        pos = (torch.arange(m) % 20 * 397).float()  # angles up to ~7500 rad
        inv = common.rope_inv_freq(hd, "cpu")
        for direction in (1, -1):
            qkv = common.rope_interleaved(z, pos.double(), inv.double(), 2 * d, direction=direction).to(torch.bfloat16)
            for side in (finish.STEPS["rope_backward"].cpu, finish_gpu.rope_backward):
                dz, zdz = side(dqkv, qkv, pos, inv, 2 * d, direction)
                assert dz.dtype == torch.bfloat16 and dz.shape == dqkv.shape and zdz.dtype == torch.float32
                back = common.rope_interleaved(dz.double(), pos.double(), inv.double(), 2 * d, direction=direction)
                err = (back - dqkv.double()).abs().max()
                assert err < 2 ** -7 * dqkv.double().abs().max(), err  # within a bf16 ulp of the largest value
                assert torch.equal(dz[:, 2 * d:], dqkv[:, 2 * d:])
                exact = (qkv.double() * dqkv.double()).sum(-1)
                assert (zdz.double() - exact).abs().max() < 1e-4 * exact.abs().max()
        print("agree")
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0 and "agree" in out.stdout, out.stderr[-2000:]
    dqkv = torch.zeros(4, 24, dtype=torch.bfloat16)
    inv = torch.ones(4)
    # the GPU kernel reads positions and inv_freq as contiguous float32 vectors, one position a row
    for bad in [dict(qkv=torch.zeros(4, 26)), dict(rotary_cols=12), dict(direction=2), dict(positions=torch.zeros(1)),
                dict(positions=torch.zeros(8)[::2]), dict(positions=torch.zeros(4, dtype=torch.float64))]:
        kw = {"qkv": torch.zeros(4, 24), "rotary_cols": 16, "direction": 1, "positions": torch.zeros(4), **bad}
        with pytest.raises(ValueError, match="rope_backward"):
            P.finish.rope_backward(dqkv, kw["qkv"], kw["positions"], inv, kw["rotary_cols"], kw["direction"])
    assert P.finish.rope_backward(dqkv, torch.zeros(4, 24), torch.zeros(4), inv, 16, 1)[0].shape == (4, 24)
