"""The judge's launcher mode (evaluate(launcher=True)): the kernel's process only describes
its calls on shapes (primitives/program.py); a second process, which loads no kernel file,
runs the description on the judge's buffers and reports what it launched. It closes the
known limit of the launch check (tests/exploits/CLASSES.md): a kernel that forges the
launch record in its own process no longer reaches the record."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epiforge.eval import evaluate

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

EXPLOITS = Path(__file__).resolve().parents[1] / "exploits"
REPO = Path(__file__).resolve().parents[2]
#: honest kernels in varied styles and the committed generated ones (the newest of each task:
#: the generated track grows by k sessions per task, and CI's time with it otherwise): none may
#: be lost to the launcher mode (a kernel that cannot be described is a false rejection)
HONEST = sorted((REPO / "tests" / "eval" / "honest_kernels").glob("*.py")) + [
    sorted(task.glob("*.py"))[-1] for task in sorted((REPO / "generated_kernels").iterdir()) if any(task.glob("*.py"))]


# every expert kernel passes in the launcher mode, the judge's default: tests/human_kernels/test_expert_kernels.py


@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_and_generated_kernels_pass_when_described(path):
    from epiforge.eval.kernel import read_kernel

    r = evaluate(read_kernel(path).task, str(path), device="cpu", shapes="smoke", seed=8, launcher=True)
    assert r.outcome.value == "PASSED", f"{path.name}: {r.message}\n{r.stderr_tail[-1500:]}"


@pytest.mark.gpu
@pytest.mark.parametrize("path", HONEST, ids=lambda p: p.stem)
def test_honest_and_generated_kernels_pass_when_described_on_the_gpu(path):
    """The same kernels on the GPU, numerics and launches only: the two devices agree (a
    torch.empty in run() was an extra launch on the CPU and none on the GPU)."""
    from epiforge.eval.kernel import read_kernel

    r = evaluate(read_kernel(path).task, str(path), device="gpu", shapes="smoke", seed=8, launcher=True, timing=False)
    assert r.outcome.value == "PASSED", f"{path.name}: {r.message}\n{r.stderr_tail[-1500:]}"


def test_a_forged_launch_record_no_longer_reaches_the_judge():
    """frame_walk_clears_guard.py, static rules off: in the one-process judge it clears the
    CPU guard's record from its own frame's caller and PASSES (the suite's strict xfail);
    described, its torch matmul is a step of the description, counted by the launcher."""
    r = evaluate("k1", str(EXPLOITS / "frame_walk_clears_guard.py"), device="cpu", shapes="smoke", seed=1234,
                 static_checks=False, launcher=True)
    assert r.outcome.value == "EXTRA_LAUNCHES", r.message
    assert "aten::mm" in r.message or "aten::_to_copy" in r.message


def test_a_kernel_that_reads_values_fails_to_describe_in_one_line(tmp_path):
    kernel = tmp_path / "peeks.py"
    kernel.write_text('"""Reads a value in run()."""\nimport primitives as P\n\nTASK = "k1_gemm_rmsnorm"\n\n'
                      "@P.epilogue(operands={'rstd': P.PerRow()})\ndef scale(acc, rstd):\n    return {'D': acc * rstd}\n\n\n"
                      "def run(inputs, prepared, config=None):\n"
                      "    if float(inputs['rstd'].sum()) > 0:\n"
                      "        return {'out': scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n"
                      "    return {'out': scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n")
    r = evaluate("k1", str(kernel), device="cpu", shapes="smoke", seed=3, static_checks=False, launcher=True)
    assert r.outcome.value == "RUNTIME_ERROR" and "read a tensor's values" in r.message, r.message


@pytest.mark.gpu
def test_a_forged_profiler_record_no_longer_reaches_the_judge_on_the_gpu():
    """frame_walk_forges_profiler.py, static rules off: the one-process judge's GPU strict
    xfail. Described, its cuBLAS matmul is a step the launcher runs and profiles itself."""
    r = evaluate("k1", str(EXPLOITS / "frame_walk_forges_profiler.py"), device="gpu", shapes="smoke", seed=1234,
                 static_checks=False, launcher=True, timeout_s=600)
    assert r.outcome.value == "EXTRA_LAUNCHES", r.message


@pytest.mark.parametrize("flags,mode", [([], "launcher"), (["--one-process"], "one-process")])
def test_the_cli_judges_in_the_launcher_mode_unless_told(flags, mode):
    out = subprocess.run([sys.executable, "-m", "epiforge", "eval", "--task", "k2", "--kernel", "human", *flags,
                          "--seed", "9", "--json"], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parents[2])
    result = json.loads(out.stdout)
    assert out.returncode == 0 and result["outcome"] == "PASSED", out.stdout[-1500:] + out.stderr[-1500:]
    assert result["environment"]["judge_mode"].startswith(mode)


def test_the_sm90a_build_is_the_launchers_own():
    """--compile in launcher mode: the epilogues are cross-compiled from their graphs in the
    process without kernel code, and that process's build record is the Result's."""
    r = evaluate("k2", "human", device="cpu", shapes="smoke", seed=4, compile=True, launcher=True)
    assert r.outcome.value == "PASSED", r.message
    assert r.compiled and all(c["ok"] for c in r.compiled) and {c["epilogue"] for c in r.compiled} == {"rmsnorm_swiglu"}


def test_a_kernel_that_fails_to_load_shows_its_own_error(tmp_path):
    """The describer loads the kernel file: its import error is the Result's stderr (not the
    launcher's, which loads no kernel), and the describer is gone with the verdict."""
    kernel = tmp_path / "breaks.py"
    kernel.write_text('"""Fails at import."""\nimport primitives as P\n\nTASK = "k1_gemm_rmsnorm"\n'
                      "raise RuntimeError('the kernel broke at import on purpose')\n\n"
                      "def run(inputs, prepared, config=None):\n    return {}\n")
    r = evaluate("k1", str(kernel), device="cpu", shapes="smoke", seed=3, static_checks=False, launcher=True)
    assert r.outcome.value == "COMPILE_ERROR" and r.stage == "load", r.message
    assert "broke at import on purpose" in r.stderr_tail  # the traceback is the describer's


def test_a_kernel_is_described_once_per_shape(tmp_path):
    """Every later input set of the same shapes runs the first description: a kernel that
    would describe a cheap path after its first calls never gets to (here: honest when first
    described, then the plain GEMM; in its own process the later, checked trial catches it)."""
    kernel = tmp_path / "changes.py"
    kernel.write_text('"""Honest on its first call of each shape, cheap after."""\nimport primitives as P\n\n'
                      'TASK = "k1_gemm_rmsnorm"\nSEEN = set()\n\n'
                      "@P.epilogue(operands={'rstd': P.PerRow()})\ndef scale(acc, rstd):\n    return {'D': acc * rstd}\n\n\n"
                      "@P.epilogue()\ndef plain(acc):\n    return {'D': acc}\n\n\n"
                      "def run(inputs, prepared, config=None):\n"
                      "    key = tuple(inputs['h'].shape)\n"
                      "    if key in SEEN:\n"
                      "        return {'out': plain(inputs['h'], inputs['w'])['D']}\n"
                      "    SEEN.add(key)\n"
                      "    return {'out': scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n")
    # one precision: a second one is described apart (its first description takes the cheap path, caught there)
    one = evaluate("k1", str(kernel), device="cpu", shapes="smoke", seed=3, static_checks=False, launcher=False,
                   dtype="bf16")
    assert one.outcome.value == "INCORRECT_NUMERICS", one.message  # the second trial runs the cheap path
    described = evaluate("k1", str(kernel), device="cpu", shapes="smoke", seed=3, static_checks=False, dtype="bf16")
    assert described.outcome.value == "PASSED", described.message  # only the honest description ever runs
