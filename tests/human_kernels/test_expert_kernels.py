"""The expert track on a CPU: every kernel PASSES through the emulator (one through the CLI),
and every one compiles for sm_90a (the exact GPU kernel, cross-compiled, no GPU needed), in
bf16, the default precision (in fp16: tests/tasks/test_fp16.py through the judge, tests/tasks/test_tolerance.py
in process)."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from epiforge import tasks
from epiforge.eval import evaluate
from epiforge.eval.machine import expert_kernel

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = [t.name for t in tasks.load_catalogue()[0]]
TASKS = [t for t in CATALOGUE if expert_kernel(t)]  # the expert track (a task may have no expert kernel)
# Known, not understood (2026-12-02): through the judge on a CPU, the cross-entropy tasks'
# experts (k5, k9) fail about one evaluation in four to ten at smoke-a's first trial, the same
# seed passing and failing from run to run (loss and lse ~2.5-3e-5 off at one row where ~7e-6
# is allowed, as if a few extra exp(0 - lse) terms were folded in), with or without the
# runner's sandbox; the same inputs in one process pass at ~3e-6 every time. The closing note
# of 2026-12-02 has the measurements. On the next machine (an AMD EPYC, a fresh .venv) it did
# not happen in 84 evaluations; fp32 GEMMs there were bit-identical across thread counts and
# memory alignments. The judge and runner now pin MKL's reproducible mode and the thread
# counts (eval/isolation.py NUMERICS_PINS), the likeliest source on the first machine.
# Only that signature is excused, by an xfail the test raises itself: the marker on the whole
# test it replaces excused any failure of these tasks (in CI on 2026-12-04, while k8 failed
# on a read-only compile lock, one of them xfailed, for a reason the log does not show).
CE_TASKS = ("k5_", "k9_", "k5l_", "k9l_")


def excuse_the_known_ce_flake(task: str, result: dict) -> None:
    worst = result.get("worst") or {}
    if (task.startswith(CE_TASKS) and result["outcome"] == "INCORRECT_NUMERICS"
            and worst.get("output") in ("loss", "lse") and worst.get("problem") != "nonfinite"):
        pytest.xfail(f"k5/k9 in the CPU runner: the known run-to-run difference ({result['message'][:200]})")



def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "epiforge", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def check_expert_verdict(task: str, seed: int, result: dict) -> None:
    excuse_the_known_ce_flake(task, result)
    assert result["outcome"] == "PASSED", f"seed {seed}: " + result["message"] + result["stderr_tail"]
    assert result["track"] == "expert" and result["author"]
    assert result["environment"]["judge_mode"].startswith("launcher")  # described, then launched without its code
    assert any(s["hidden"] for s in result["per_shape"])
    assert {s["dtype"] for s in result["per_shape"]} == {"bfloat16"}  # as narrowed, and the verdict says so
    assert result["message"].endswith("; not judged in float16 (narrowed by --dtype)")
    checks = [c for s in result["per_shape"] for c in s["outputs"]]
    assert checks and all(c["max_error"] <= c["allowed"] for c in checks)
    assert result["compiled"] and all(c["ok"] for c in result["compiled"]), result["compiled"]


@pytest.mark.parametrize("task", TASKS)
def test_expert_kernel_passes_on_cpu_and_compiles_for_sm90a(task):
    """The evaluation a user's `eval --compile` runs, with the sm_90a build of every GEMM it
    runs (one evaluation for both: CI's time), narrowed to bf16: fp16's numerics are in
    tests/tasks/test_tolerance.py (every expert in process, every precision), its sm_90a builds in
    tests/primitives/test_gemm_config.py (the fp16 precompile of every expert). Through evaluate(), whose
    judge the suite's warm zygote forks (a new Python per judge cost each task ~7 s more); the
    CLI's own way to the same verdict is the test below."""
    # a new seed every run, as a user's evaluation gets; named, so that a failure can be replayed
    seed = random.SystemRandom().randrange(2**31)
    r = evaluate(task, "human", device="cpu", shapes="smoke", seed=seed, compile=True, dtype="bf16")
    check_expert_verdict(task, seed, r.model_dump(mode="json"))


def test_the_cli_eval_of_an_expert_gives_the_same_verdict():
    """The CLI, as a user runs it: a judge of its own (not warm), the same checks."""
    seed = random.SystemRandom().randrange(2**31)
    out = cli("eval", "--task", "k1", "--kernel", "human", "--device", "cpu", "--shapes", "smoke", "--json",
              "--seed", str(seed), "--compile", "--dtype", "bf16")
    assert out.returncode == 0, out.stderr[-2000:]
    check_expert_verdict("k1_gemm_rmsnorm", seed, json.loads(out.stdout))


#: the tasks whose tensors depend on head_dim (RoPE, QK-norm): their kernels must not assume 128
HEAD_TASKS = [t for t in TASKS if any("head_dim" in e for spec in tasks.get_task(t).inputs for e in spec.shape)]


#: head tasks whose only head-dependent GEMM runs another head task's quack library epilogue
#: (the RoPE direction lives in the prepared table, not the code): at the head dims below they
#: are checked for numerics, and that task's case builds the epilogue for sm_90a (the layer's
#: other 11 GEMMs do not depend on head_dim; its smoke case builds them). CI's time.
ROPE_BUILT_BY = {"k3hf_gemm_rope": ("k3_gemm_rope", "qkv_rope"),
                 "k4hf_gemm_rmsnorm_rope": ("k4_gemm_rmsnorm_rope", "qkv_rmsnorm_rope"),
                 "layer_non_attention_fwd_bwd": ("k4_gemm_rmsnorm_rope", "qkv_rmsnorm_rope")}


def test_the_head_tasks_not_built_at_other_head_dims_share_a_built_ones_epilogue():
    from epiforge.eval.kernel import load_kernel_module

    assert set(ROPE_BUILT_BY) < set(HEAD_TASKS)
    for task, (built, name) in ROPE_BUILT_BY.items():
        assert built in HEAD_TASKS and built not in ROPE_BUILT_BY
        ours, theirs = (getattr(load_kernel_module(expert_kernel(t)), name) for t in (task, built))
        assert ours.target == theirs.target and ours.target.startswith("quack.epilogue.rotary:"), task


@pytest.mark.parametrize("task", HEAD_TASKS)
def test_expert_kernel_passes_and_compiles_at_head_dim_64_and_256(task):
    assert {s.head_dim for s in tasks.shape_sets()["heads"]} == {64, 256}
    build = task not in ROPE_BUILT_BY
    # bf16: fp16's numerics at these shapes in process (tests/tasks/test_tolerance.py), its builds in test_gemm_config.py
    r = evaluate(task, "human", device="cpu", shapes="heads", seed=1, compile=build, dtype="bf16")
    assert r.outcome.value == "PASSED", r.message + r.stderr_tail
    if build:
        assert r.compiled and all(c["ok"] for c in r.compiled), r.compiled


def test_a_wrong_kernel_fails_with_its_worst_element(tmp_path):
    src = (REPO / "human_kernels" / "k1_gemm_rmsnorm.py").read_text()
    bad = tmp_path / "k1_off_by_one_percent.py"
    bad.write_text(src.replace('{"D": acc * rstd}', '{"D": acc * rstd * 1.01}'))
    out = cli("eval", "--task", "k1", "--kernel", str(bad), "--json")
    assert out.returncode == 1
    r = json.loads(out.stdout)
    assert r["outcome"] == "INCORRECT_NUMERICS"
    worst = next(c for c in r["per_shape"][0]["outputs"] if not c["ok"])
    # a 1% scale error: depending on the draw the max rule or the RMS guard catches it
    assert worst["problem"] in ("tolerance", "rms") and worst["rms_error"] > worst["rms_allowed"]
    assert len(worst["worst_index"]) == 2 and worst["got"] != worst["expected"]


def test_an_epilogue_the_dsl_rejects_is_a_compile_error(tmp_path):
    src = (REPO / "human_kernels" / "k1_gemm_rmsnorm.py").read_text()
    bad = tmp_path / "k1_torch_method.py"
    # torch has Tensor.clamp, the DSL's Float32 has not: the emulator could run it, the compiler does not
    bad.write_text(src.replace('{"D": acc * rstd}', '{"D": (acc * rstd).clamp(-100.0, 100.0)}'))
    ruled = evaluate("k1", str(bad), seed=0)
    assert ruled.outcome.value == "STATIC_REJECTED" and any("clamp" in v for v in ruled.violations), ruled.message
    # behind the rules, in the judge's default mode: the body cannot be traced into the graph the
    # GPU would build, so it does not build, with or without the sm_90a cross-compile
    for compile_ in (False, True):
        r = evaluate("k1", str(bad), compile=compile_, seed=0, static_checks=False)
        assert r.outcome.value == "COMPILE_ERROR" and "row_scale" in r.message and "sm_90a" in r.message, r.message
    # in its own process: the CPU guard sees non-arithmetic torch in the body, the sm_90a build rejects it
    guarded = evaluate("k1", str(bad), compile=False, seed=0, static_checks=False, launcher=False)
    assert guarded.outcome.value == "EXTRA_LAUNCHES" and "inside an epilogue body" in guarded.message, guarded.message
    r = evaluate("k1", str(bad), compile=True, seed=0, static_checks=False, launcher=False)
    assert r.outcome.value == "COMPILE_ERROR"
    assert "row_scale" in r.message and "sm_90a" in r.message


def test_cli_light_commands():
    out = cli("tasks", "list", "--json")
    listed = json.loads(out.stdout)
    assert [t["name"] for t in listed] == CATALOGUE
    for t in listed:
        assert {"name", "description", "inputs", "outputs", "shapes", "tolerance", "flops", "bytes"} <= set(t)
        assert len(t["flops"]["paper"]) == 3 and all(b > 0 for b in t["bytes"]["smoke"])
    show = cli("tasks", "show", "k3")
    assert show.returncode == 0 and "inv_freq" in show.stdout
    # each named shape set's dims and the GEMM they make: k3's is (M, 3d, d), at 1B M=16384, d=2048
    one_b = next(s for s in tasks.shape_sets()["paper"] if s.name == "1B")
    assert (one_b.M, one_b.d) == (16384, 2048) and "GEMM 16384 x 6144 x 2048" in show.stdout
    assert all(f" {s.name}: M={s.M} " in show.stdout for ss in tasks.shape_sets().values() for s in ss)
    bad = cli("tasks", "show", "k99")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown task" in bad.stderr
    missing = cli("eval", "--task", "k1", "--kernel", "/nonexistent/kernel.py")
    assert missing.returncode == 2 and "no kernel file" in missing.stderr
