"""eval/compare.py and `epiforge compare`: selecting kernels, judging several together, and
(driven for real on a CPU, with the host's clock) several kernels timed in one interleaved
run, their ratios to each other taken repetition by repetition; a kernel that fails in the
timed phase is dropped and the others are timed without it."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epiforge import tasks
from epiforge.eval import gpu_stages, numerics
from epiforge.eval.compare import Comparison, compare, select_kernels
from epiforge.eval.kernel import resolve_kernel
from epiforge.eval.plausibility import Ceilings
from epiforge.eval.remote import KernelProcess

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REPO = Path(__file__).resolve().parents[2]
#: the scripted k8 replay (backend anthropic; the real sessions' kernels are the command backend's)
GENERATED = REPO / "generated_kernels" / "k8_gemm_swiglu" / "20261130T184615Z-k8-a840f4.py"
ROW_SCALE = ("import torch\nimport primitives as P\nTASK = 'k1_gemm_rmsnorm'\ncalls = [0]\n\n"
             "@P.epilogue(operands={'rstd': P.PerRow()})\ndef row_scale(acc, rstd):\n    return {'D': acc * rstd}\n\n"
             "def run(inputs, prepared, config=None):\n    calls[0] += 1\n")


def test_selecting_kernels(tmp_path):
    assert select_kernels("k8", ["expert"]) == [("expert", REPO / "human_kernels" / "k8_gemm_swiglu.py")]
    committed = sorted((REPO / "generated_kernels" / "k8_gemm_swiglu").glob("*.py"))
    assert len(committed) >= 2 and GENERATED in committed  # the scripted replay and a real session's
    assert sorted(select_kernels("k8", ["generated"])) == sorted((f"generated:{p.stem}", p) for p in committed)
    assert select_kernels("k8", ["generated:backend=anthropic"]) == [(f"generated:{GENERATED.stem}", GENERATED)]
    assert select_kernels("k8", ["generated:backend=anthropic"]) == select_kernels("k8", [f"generated:{GENERATED.stem}"])
    bare = [t for t in ("k3d", "k4d", "k4hf", "k5l", "k9l", "layer")
            if not any((REPO / "generated_kernels" / tasks.get_task(t).name).glob("*.py"))]
    if bare:  # a task with no generated kernel: none picked
        assert select_kernels(bare[0], ["expert", "generated"])[1:] == []
    for bad, fragment in ((["generated:model=nobody"], "no generated kernel"), (["generated:colour=red"], "select"),
                          (["expert", "expert"], "share a label"), ([str(tmp_path / "nope.py")], "no kernel file")):
        with pytest.raises(ValueError, match=fragment):
            select_kernels("k8", bad)
    with pytest.raises(ValueError, match="no generated kernel nope of k8_gemm_swiglu .looked in .*generated_kernels"):
        resolve_kernel("generated:nope", "k8_gemm_swiglu")
    # judged together, a filter need match in one task: the others keep their other kernels
    assert select_kernels("k1", ["expert", "generated:backend=anthropic"], one_of_several=True) == \
        select_kernels("k1", ["expert"])


def test_a_generated_filter_over_several_tasks_must_match_in_one(capsys):
    from epiforge import cli

    assert cli.main(["compare", "--task", "k1", "k8", "--kernels", "expert", "generated:model=nobody"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generated:model=nobody: no generated kernel of these tasks matches" in err
    assert cli.main(["compare", "--task", "k1", "--kernels", "expert", "generated:model=nobody"]) == 2
    assert "no generated kernel of k1_gemm_rmsnorm matches" in capsys.readouterr().err


def test_compare_on_a_cpu_judges_each_kernel_and_times_none(tmp_path):
    wrong = tmp_path / "k8_wrong.py"
    wrong.write_text(GENERATED.read_text().replace('return {"out": P.swiglu(gate, up)}', 'return {"out": gate * up}'))
    cmp = compare("k8", [("expert", REPO / "human_kernels/k8_gemm_swiglu.py"), ("wrong", wrong)], seed=5)
    assert isinstance(cmp, Comparison) and cmp.labels == ["expert", "wrong"]
    expert, bad = cmp.results
    assert expert.passed and expert.provisional and not any(s.timing for s in expert.per_shape)
    assert bad.outcome.value == "INCORRECT_NUMERICS"
    assert cmp.versus("wrong", "expert", "smoke-a") is None  # nothing timed on a CPU


def timed_together(kernels: dict[str, Path], tmp_path, reps=7):
    task = tasks.get_task(kernels.pop("_task"))
    shape = tasks.shape_sets()["smoke"][0]
    procs = {}
    try:
        for i, (name, path) in enumerate(kernels.items()):
            kp = KernelProcess(tmp_path / f"runner-{i}", deadline=time.monotonic() + 600)
            kp.ask({"op": "load", "path": str(path), "device": "cpu"}, stage="load")
            res = numerics.check_shape(task, kp, shape, 9, 0, "cpu")
            assert res.outcome.value == "PASSED", res.message
            procs[name] = (kp, res)
        gpu_stages.run_timed_stages(task, procs, shape, 9, 0, stage=lambda s: None, ceilings=Ceilings(), reps=reps,
                                    device="cpu")
    finally:
        for kp, _ in procs.values():
            kp.close()
    return {name: res for name, (_, res) in procs.items()}


def test_kernels_timed_together_have_per_repetition_ratios_to_each_other(tmp_path):
    res = timed_together({"_task": "k8_gemm_swiglu", "expert": REPO / "human_kernels/k8_gemm_swiglu.py",
                          "gen": GENERATED}, tmp_path)
    e, g = res["expert"].timing, res["gen"].timing
    assert res["expert"].outcome.value == res["gen"].outcome.value == "PASSED"
    assert "kernel:gen" in e.baselines and "kernel:expert" in g.baselines
    assert e.kernel.n == g.kernel.n == 7 and e.baselines["gemm_only"].median_us == g.baselines["gemm_only"].median_us
    cmp = Comparison(task="k8_gemm_swiglu", device="cuda", shapes="smoke", labels=["expert", "gen"],
                     results=[_as_result(res["expert"]), _as_result(res["gen"])])
    vs = cmp.versus("gen", "expert", "smoke-a")  # gen_i / expert_i over the 7 repetitions
    assert vs.median == pytest.approx(e.speedup["kernel:gen"].median) and vs.ci_low <= vs.median <= vs.ci_high
    # a Result keyed on another precision is never paired: not with the expert's bf16 row, not at fp16's shape
    half = cmp.results[1].model_copy(update={"dtypes": ["float16"]})
    assert Comparison(**{**cmp.model_dump(), "results": [cmp.results[0], half]}).versus("gen", "expert", "smoke-a") is None
    assert cmp.versus("gen", "expert", "smoke-a", "float16") is None
    # the table: one speedup column per baseline timed, each cell that baseline's median and interval
    from epiforge.cli import render_comparison

    table = render_comparison(cmp).splitlines()
    head = next(line for line in table if line.startswith("| kernel"))
    assert "x eager (95%)" in head and "x cublas (95%)" in head and "x liger" not in head  # liger not asked for
    cols = [c.strip() for c in head.strip("|").split("|")]
    gen_row = [c.strip() for c in next(line for line in table if line.startswith("| gen ")).strip("|").split("|")]
    eager = g.speedup["eager"]
    assert gen_row[cols.index("x eager (95%)")] == f"{eager.median:.3f}x ({eager.ci_low:.3f}-{eager.ci_high:.3f})"
    assert gen_row[-1].startswith(f"{vs.median:.3f} (")
    assert any(line.startswith("- gemm_only: the speed of light") for line in table)


def test_a_kernel_that_fails_in_the_timed_phase_is_dropped_and_the_others_timed(tmp_path):
    honest = tmp_path / "k1_honest.py"
    honest.write_text(ROW_SCALE + "    return {'out': row_scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n")
    cheat = tmp_path / "k1_cheat.py"
    cheat.write_text(ROW_SCALE + "    if calls[0] > 4:\n        return {'out': torch.zeros(inputs['h'].shape[0], "
                                 "inputs['w'].shape[0], dtype=torch.bfloat16)}\n"
                                 "    return {'out': row_scale(inputs['h'], inputs['w'], rstd=inputs['rstd'])['D']}\n")
    res = timed_together({"_task": "k1_gemm_rmsnorm", "honest": honest, "cheat": cheat}, tmp_path)
    assert res["cheat"].outcome.value == "INCORRECT_NUMERICS" and res["cheat"].timing is None
    assert res["honest"].outcome.value == "PASSED" and "kernel:cheat" not in res["honest"].timing.baselines


def _as_result(shape_result):
    from epiforge.eval.result import Outcome, Result

    base = dict(task="k8_gemm_swiglu", kernel="k.py", kernel_sha256="0", track="candidate", device="cuda",
                shapes="smoke")
    return Result.judged(base, Outcome.PASSED, "done", "passed", [shape_result])


def test_the_cli_compares_and_stores(tmp_path):
    db = tmp_path / "r.sqlite"
    out = subprocess.run([sys.executable, "-m", "epiforge", "compare", "--task", "k8", "--device", "cpu",
                          "--kernels", "expert", "generated:backend=anthropic",
                          "--store", str(db), "--json", "--seed", "4", "--dtype", "bf16"], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (cmp,) = json.loads(out.stdout)
    assert cmp["labels"] == ["expert", f"generated:{GENERATED.stem}"]
    assert all(r["outcome"] == "PASSED" and r["provisional"] and r["compiled"] for r in cmp["results"])
    from epiforge.eval.store import ResultStore

    assert sorted(r.result.track for r in ResultStore(db).rows()) == ["expert", "generated"]
    # without --json: the table as printed, a wide row unwrapped when piped, and where the time went
    # several tasks (a repeat judged once), in the order given
    out = subprocess.run([sys.executable, "-m", "epiforge", "compare", "--task", "k1", "k9", "k1_gemm_rmsnorm",
                          "--kernels", "expert", "--device", "cpu", "--seed", "4"], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert [line for line in lines if line.startswith("## ")] == [
        "## k1_gemm_rmsnorm on the CPU (smoke shapes)", "## k9_gemm_partial_cross_entropy on the CPU (smoke shapes)"]
    lines = lines[:lines.index("## k9_gemm_partial_cross_entropy on the CPU (smoke shapes)")]
    for precision in ("bfloat16", "float16"):  # every precision judged, each shape's row naming its own
        assert any(line.startswith(f"| expert | expert | PASSED (provisional) | ok | smoke-a ({precision}) |")
                   for line in lines)
    (judged,) = [line for line in lines if line.startswith("Judged in ")]
    assert "numerics " in judged  # stages under half a second are left out (load, with a spare runner)
    assert [line for line in lines if line][-1].startswith("Timing: absent.") and "Traceback" not in out.stderr
    bad = subprocess.run([sys.executable, "-m", "epiforge", "compare", "--task", "k8", "--kernels",
                          "generated:model=nobody"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no generated kernel" in bad.stderr


def _judges_of_this_process() -> set[int]:
    """The pids of the judges this process started (Linux /proc): its children that run
    the judge, and the children of its warm judges' zygotes (eval/judge_zygote.py)."""
    import os

    procs = {}  # pid -> (parent, command line)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        procs[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmdline)
    zygotes = {pid for pid, (parent, cmd) in procs.items() if parent == os.getpid() and b"eval.judge_zygote" in cmd}
    return {pid for pid, (parent, cmd) in procs.items()
            if (parent == os.getpid() and b"epiforge.eval.judge\0" in cmd) or parent in zygotes}


def test_several_tasks_are_judged_by_one_judge_in_order():
    from epiforge.eval.compare import compare_all

    plans = [(t, [("expert", REPO / "human_kernels" / f"{tasks.get_task(t).name}.py")]) for t in ("k1", "k9")]
    heard, done = [], []
    cmps = compare_all(plans, device="cpu", shapes="smoke", seed=3,
                       on_stage=lambda task, stage: heard.append((task, stage, frozenset(_judges_of_this_process()))),
                       on_done=lambda cmp: done.append(cmp.task))
    assert [c.task for c in cmps] == done == ["k1_gemm_rmsnorm", "k9_gemm_partial_cross_entropy"]
    assert all(r.passed for c in cmps for r in c.results)
    tasks_heard = [task for task, _, _ in heard]
    assert tasks_heard == sorted(tasks_heard) and set(tasks_heard) == set(done)  # k1's stages, then k9's
    judges = {pid for _, _, pids in heard for pid in pids}
    assert len(judges) == 1, judges  # one process judged both
    assert all(stage in {s for t, s, _ in heard if t == task} for task in done for stage in ("load", "numerics", "done"))
    # each task's seconds are its own: the second one's first stage does not count the judge's start
    assert all(set(r.stage_s) >= {"load", "numerics"} for c in cmps for r in c.results)


def test_a_judge_that_dies_costs_one_task_its_verdict_and_the_next_gets_a_new_judge():
    import os
    import signal

    from epiforge.eval.compare import compare_all

    plans = [(t, [("expert", REPO / "human_kernels" / f"{tasks.get_task(t).name}.py")]) for t in ("k1", "k8", "k9")]
    seen = {}

    def on_stage(task, stage):
        seen.setdefault(task, set()).update(_judges_of_this_process())
        if task == "k8_gemm_swiglu" and stage == "numerics":
            for pid in _judges_of_this_process():
                os.kill(pid, signal.SIGKILL)

    first, killed, last = compare_all(plans, device="cpu", shapes="smoke", seed=3, on_stage=on_stage)
    assert first.results[0].passed and last.results[0].passed
    (lost,) = killed.results
    assert lost.outcome.value == "RUNTIME_ERROR" and lost.stage == "numerics"
    assert "SIGKILL" in lost.message and "during numerics" in lost.message
    assert seen["k1_gemm_rmsnorm"] & seen["k8_gemm_swiglu"]  # k1 and k8: the same judge
    assert not seen["k8_gemm_swiglu"] & seen["k9_gemm_partial_cross_entropy"]  # k9: a new one


def test_each_job_of_a_judge_compiles_its_baseline_afresh():
    """One code object (baselines.unfused_fn's) serves every task's torch.compile baseline:
    in one process its dynamo cache entries pile up, and past dynamo's recompile limit the
    baseline silently runs uncompiled. The judge resets dynamo between jobs."""
    import torch
    from torch._dynamo.utils import counters

    from epiforge.eval import judge
    from epiforge.eval.baselines import extra_baselines

    def graphs_built(names, between):
        built = []
        with torch._dynamo.config.patch(recompile_limit=2):
            torch._dynamo.reset()
            for name in names:
                task = tasks.get_task(name)
                dims = tasks.shape_sets()["smoke"][0].dims()
                before = counters["stats"]["unique_graphs"]
                extra_baselines(["torch_compile"], task, dims, [task.make_inputs(dims, 1, "cpu")], "cpu")
                built.append(counters["stats"]["unique_graphs"] - before)
                between()
        return built

    assert graphs_built(["k1", "k8", "k9"], lambda: None)[-1] == 0  # the hazard: the third ran uncompiled
    assert all(graphs_built(["k1", "k8", "k9"], lambda: judge._between_jobs("cpu")))


def test_quack_library_says_whether_the_expert_is_the_library_or_the_library_has_none():
    """compare's quack_library baseline is left out for two different reasons, and says which:
    k8's expert kernel is quack's library SwiGLU epilogue itself; quack has no epilogue
    for k1's task (its expert is ours); k2 has one, which is built."""
    from epiforge.eval.baselines import extra_baselines

    dims = tasks.shape_sets()["smoke"][0].dims()
    why = {}
    for name in ("k8", "k1", "k2"):
        task = tasks.get_task(name)
        fns, _, skipped = extra_baselines(["quack_library"], task, dims, [task.make_inputs(dims, 1, "cpu")], "cpu")
        why[name] = skipped.get("quack_library", "built" if "quack_library" in fns else "?")
    assert why == {"k8": "the expert kernel is quack's library epilogue itself",
                   "k1": "quack's library has no epilogue for this task", "k2": "built"}


def test_one_kernel_is_judged_in_both_modes_side_by_side():
    """compare(launcher={labels}): the labelled kernels describe themselves and a process
    without kernel code runs them; the others run in their own process (one judge, one run)."""
    path = REPO / "human_kernels/k1_gemm_rmsnorm.py"
    cmp = compare("k1", [("one-process", path), ("launcher", path)], seed=5, launcher=frozenset({"launcher"}))
    assert [r.environment["judge_mode"].split(":")[0] for r in compare("k1", [("a", path)], seed=5, launcher=False).results] \
        == ["one-process"]
    one, described = cmp.results
    assert one.passed and described.passed, described.message
    assert one.environment["judge_mode"].startswith("one-process")
    assert described.environment["judge_mode"].startswith("launcher")


def test_a_launcher_row_is_the_per_repetition_ratio_of_the_two_modes(tmp_path):
    from lab.bench.rows import LauncherRow

    res = timed_together({"_task": "k8_gemm_swiglu", "expert": REPO / "human_kernels/k8_gemm_swiglu.py",
                          "gen": GENERATED}, tmp_path, reps=9)
    cmp = Comparison(task="k8_gemm_swiglu", device="cuda", shapes="smoke", labels=["expert", "gen"],
                     results=[_as_result(res["expert"]), _as_result(res["gen"])])
    row = LauncherRow.of(cmp, "smoke-a", one_process="expert", launcher="gen")
    # launcher_i / one-process_i: the inverse of gen's own speedup over the expert (expert_i /
    # gen_i), whose median over an odd count of repetitions inverts exactly
    assert res["gen"].timing.kernel.n == 9
    assert row.launcher_over_one_process.median == pytest.approx(1 / res["gen"].timing.speedup["kernel:expert"].median)
    assert row.fused_over_gemm_only == {"one-process": res["expert"].timing.fused_over_gemm_only.median,
                                        "launcher": res["gen"].timing.fused_over_gemm_only.median}
    assert LauncherRow.of(cmp, "no-such-shape", "expert", "gen") is None


def test_compare_needs_at_least_one_repetition(capsys):
    from epiforge import cli

    for reps in ("0", "-3"):
        assert cli.main(["compare", "--task", "k0", "--reps", reps]) == 2
        assert capsys.readouterr().err.strip() == f"epiforge: --reps must be at least 1 (got {reps})"
