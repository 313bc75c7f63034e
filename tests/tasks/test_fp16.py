"""A task in several precisions (tasks/AUTHORING.md "Precisions"): `dtypes` and
`dtype = "precision"` tensors resolve per run (Task.at), inputs carry the run's precision,
the allowance comes from the reference in that precision by the same rule, every precision
is judged by default (issue 42, class 6) and --dtype narrows it, the verdict then naming
what it left out, a kernel that
computes or stores bf16 when asked for fp16 is rejected, and results from before fp16 read
as bf16. (The store, leaderboard and compare keying: tests/eval/test_store.py,
tests/eval/test_leaderboard.py, tests/eval/test_compare.py, lab/tests/test_compare_export.py.)"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from epiforge import tasks
from epiforge.eval import evaluate
from epiforge.eval.evaluation import pick_dtypes
from epiforge.eval.result import Result
from epiforge.tasks.spec import TaskError, load_task_file
from epiforge.tasks.tolerance import check_output

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = tasks.load_catalogue()[0]
SMOKE = tasks.shape_sets()["smoke"][0].dims()

#: k1's folder: a shipped task in both precisions (h, w, out follow the run's; rstd is float32)
K1 = tasks.get_task("k1").folder
BOTH = 'dtypes = ["bfloat16", "float16"]'
W_FOLLOWS = 'name = "w"\nshape = ["3*d", "d"]\ndtype = "precision"'


def write_task(root: Path, edit=lambda text: text) -> Path:
    """k1's task folder copied under root, its task.toml `edit`ed; returns that task.toml."""
    folder = root / K1.name
    shutil.copytree(K1, folder, ignore=shutil.ignore_patterns("__pycache__"))
    spec = (K1 / "task.toml").read_text()
    assert BOTH in spec and W_FOLLOWS in spec  # what the edits below rewrite
    (folder / "task.toml").write_text(edit(spec))
    return folder / "task.toml"


def test_precision_tensors_take_the_runs_dtype_and_the_others_stay(tmp_path):
    task = load_task_file(write_task(tmp_path))
    assert task.dtypes == ["bfloat16", "float16"] and task.precision == "bfloat16"
    dtype = {t.name: t.dtype for t in [*task.inputs, *task.outputs]}
    assert dtype == {"h": "bfloat16", "w": "bfloat16", "rstd": "float32", "out": "bfloat16"}
    half = task.at("float16")
    assert half.precision == "float16"
    assert {t.name: t.dtype for t in [*half.inputs, *half.outputs]} == {
        "h": "float16", "w": "float16", "rstd": "float32", "out": "float16"}
    assert task.at("bfloat16") is task and task.inputs[0].dtype == "bfloat16"  # at() leaves the task as it was
    inputs = half.make_inputs(SMOKE, seed=1)  # make_inputs is handed dtype=float16
    assert inputs["h"].dtype == torch.float16 and inputs["rstd"].dtype == torch.float32
    with pytest.raises(TaskError, match="runs in bfloat16, float16, not float32"):
        task.at("float32")


def test_a_task_that_says_nothing_runs_in_bf16_only(tmp_path):
    task = load_task_file(write_task(tmp_path, lambda text: text.replace(BOTH, "")))
    assert task.dtypes == ["bfloat16"] and task.precision == "bfloat16"
    assert [t.dtype for t in task.inputs] == ["bfloat16", "float32", "bfloat16"]
    with pytest.raises(TaskError, match="runs in bfloat16, not float16"):
        task.at("float16")
    # a task without a dtypes line is bf16-only; the shipped ones list both
    assert all(t.dtypes == ["bfloat16", "float16"] for t in CATALOGUE)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace(W_FOLLOWS, W_FOLLOWS.replace("precision", "bfloat16")), "a (h) and b (w) must have one dtype"),
    (lambda t: t.replace(BOTH, 'dtypes = ["bfloat16", "bfloat16"]'), "lists a precision twice"),
    (lambda t: t.replace(BOTH, 'dtypes = ["float32"]'), "dtypes.0"),
    (lambda t: t.replace(BOTH, "dtypes = []"), "dtypes"),
    (lambda t: 'precision = "float16"\n' + t, "precision: not a task.toml key"),
    (lambda t: t.replace('dtype = "precision"', 'dtype = "bfloat16"'), 'no tensor has dtype = "precision"'),
], ids=["a-and-b-differ", "twice", "not-16-bit", "none", "precision-key", "nothing-follows"])
def test_bad_precision_specs_are_one_line(tmp_path, edit, message):
    path = write_task(tmp_path, edit)
    with pytest.raises(TaskError) as e:
        load_task_file(path)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("task", [t for t in CATALOGUE if "float16" in t.dtypes], ids=lambda t: t.id)
def test_fp16_inputs_carry_fp16_precision(task):
    """Drawn in fp16, not bf16 values widened: else a kernel computing in bf16 would lose nothing."""
    half = task.at("float16")
    inputs = half.make_inputs(SMOKE, seed=2)
    for spec in half.inputs:
        t = inputs[spec.name]
        assert t.dtype == spec.torch_dtype
        if spec.follows_precision:
            assert t.dtype == torch.float16
            assert not torch.equal(t.to(torch.bfloat16).to(torch.float16), t), f"{spec.name} holds only bf16 values"


def _k1(dtype: str, seed: int = 4):
    task = tasks.get_task("k1").at(dtype)
    inputs = task.make_inputs(SMOKE, seed=seed)
    exact = task.reference(inputs, SMOKE, exact=True)["out"]
    lowprec = task.reference(inputs, SMOKE, exact=False)["out"]
    return task, inputs, exact, lowprec


def test_fp16_allowance_comes_from_the_fp16_reference_by_the_same_rule():
    task, inputs, exact, lowprec = _k1("float16")
    h, w, rstd = inputs["h"], inputs["w"], inputs["rstd"]
    # what an honest fused kernel computes, written out here: float32 products and epilogue, one fp16 rounding
    honest = (rstd[:, None] * (h.float() @ w.float().T)).to(torch.float16)
    truth = rstd.double()[:, None] * (h.double() @ w.double().T)
    assert torch.equal(lowprec, honest) and torch.allclose(exact, truth, rtol=0, atol=1e-12)
    spec = task.outputs[0]
    check = check_output(spec, honest, exact, lowprec)
    assert check.ok
    assert check.allowed == pytest.approx(2.0 * (honest.double() - truth).abs().max().item() + 1e-6, rel=1e-9)
    # fp16 has 3 more significant bits than bf16: its allowance is about 8 times tighter
    _, _, exact_bf, low_bf = _k1("bfloat16")
    bf = check_output(tasks.get_task("k1").outputs[0], low_bf, exact_bf, low_bf)
    assert 4 < bf.allowed / check.allowed < 16


def test_an_output_computed_in_bf16_fails_the_fp16_rule():
    task, inputs, exact, lowprec = _k1("float16")
    h, w, rstd = inputs["h"], inputs["w"], inputs["rstd"]
    via_bf16 = (rstd[:, None] * (h.bfloat16().float() @ w.bfloat16().float().T)).to(torch.float16)
    rounded_bf16 = lowprec.to(torch.bfloat16).to(torch.float16)
    spec = task.outputs[0]
    for out in (via_bf16, rounded_bf16):
        assert check_output(spec, out, exact, lowprec).problem == "tolerance"
    assert check_output(spec, lowprec.to(torch.bfloat16), exact, lowprec).problem == "dtype"


@pytest.mark.spawns
def test_an_expert_kernel_passes_in_fp16_through_the_judge_and_builds_for_sm90a():
    """k7 (a packed-pair epilogue, two outputs) as a user runs it in fp16 only: the judge's
    numerics at every shape, hidden ones too, and its GEMMs cross-compiled for fp16 operands.
    The other experts pass the fp16 rule in process (tests/tasks/test_tolerance.py)."""
    r = evaluate("k7", "human", device="cpu", shapes="smoke", seed=6, dtype="fp16", compile=True)
    assert r.outcome.value == "PASSED", r.message + r.stderr_tail
    assert "in float16" in r.message
    assert [(s.dtype, s.hidden) for s in r.per_shape] == [("float16", h) for h in (False, False, True, True)]
    assert r.dtypes == ["float16"]  # keyed on fp16: the store and the leaderboard keep it apart from bf16
    assert r.compiled and all(c["ok"] for c in r.compiled), r.compiled


def _kernel(task: str) -> str:
    return (REPO / "human_kernels" / f"{tasks.get_task(task).name}.py").read_text()


# kernels written for bf16 that silently stay there (casts are allowed only in prepare())
CHEATS = {
    # k0 with its norm weight rounded to bf16 once, in prepare(): h = x * weight loses fp16's last bits
    "weight_in_bf16": ("k0", lambda src: src.replace(
        "\ndef run(", '\ndef prepare(consts):\n    return {"nw": consts["norm_weight"].bfloat16()}\n\n\ndef run(').replace(
        'weight=inputs["norm_weight"]', 'weight=prepared["nw"]'), "INCORRECT_NUMERICS"),
    # k1 storing D in bf16 whatever its inputs are
    "stores_bf16": ("k1", lambda src: src.replace("import primitives as P", "import torch\nimport primitives as P").replace(
        'out = row_scale(inputs["h"], inputs["w"],', 'out = row_scale(inputs["h"], inputs["w"], dtypes={"D": torch.bfloat16},'),
        "INCORRECT_DTYPE"),
}


@pytest.mark.spawns
@pytest.mark.parametrize("name", CHEATS)
def test_a_kernel_that_works_in_bf16_when_asked_for_fp16_is_rejected(tmp_path, name):
    task, edit, outcome = CHEATS[name]
    src = edit(_kernel(task))
    assert src != _kernel(task)
    path = tmp_path / f"{task}_{name}.py"
    path.write_text(src)
    narrowed = evaluate(task, path, device="cpu", shapes="smoke", seed=3, hidden_shapes=False, dtype="bf16")
    assert narrowed.outcome.value == "PASSED", narrowed.message  # in bf16 the cheat is the honest kernel
    assert [s.dtype for s in narrowed.per_shape] == ["bfloat16", "bfloat16"] and narrowed.dtypes == ["bfloat16"]
    assert narrowed.message.endswith("; not judged in float16 (narrowed by --dtype)"), narrowed.message
    both = evaluate(task, path, device="cpu", shapes="smoke", seed=3, hidden_shapes=False)  # the default: all
    assert both.outcome.value == outcome, both.message
    assert "in float16" in both.message and both.dtypes == ["bfloat16", "float16"] and both.dtype == "bfloat16"
    assert [s.dtype for s in both.per_shape] == ["bfloat16", "bfloat16", "float16"]  # stopped at fp16's first shape


def test_dtype_picks_precisions_in_order_and_defaults_to_all():
    k1 = tasks.get_task("k1")
    assert pick_dtypes(k1) == pick_dtypes(k1, "all") == ["bfloat16", "float16"]
    assert pick_dtypes(k1, "fp16") == pick_dtypes(k1, "float16") == pick_dtypes(k1, "half") == ["float16"]
    assert pick_dtypes(k1, "fp16, bf16,float16") == ["float16", "bfloat16"]  # as named, each once
    assert pick_dtypes(k1, ["bf16"]) == ["bfloat16"]
    for bad, says in (("float32", "--dtype 'float32': k1_gemm_rmsnorm runs in bfloat16, float16 (or all)"),
                      (",", "--dtype '': k1_gemm_rmsnorm runs in"), ([], "--dtype: no precision named")):
        with pytest.raises(ValueError, match=re.escape(says)):
            pick_dtypes(k1, bad)


def test_a_kernel_stopped_before_the_judge_is_keyed_on_the_precision_asked_for(tmp_path):
    path = tmp_path / "k1_broken.py"
    path.write_text("TASK = 'k1_gemm_rmsnorm'\ndef run(inputs, prepared:\n")
    r = evaluate("k1", path, device="cpu", dtype="fp16")
    assert r.outcome.value == "COMPILE_ERROR" and r.stage == "static" and r.dtypes == ["float16"]


@pytest.mark.spawns
def test_a_precision_the_task_does_not_list_is_one_line():
    out = subprocess.run([sys.executable, "-m", "epiforge", "eval", "--task", "k1", "--kernel", "human",
                          "--dtype", "float32"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["epiforge: --dtype 'float32': k1_gemm_rmsnorm runs in bfloat16, float16 (or all)"]


def test_shipped_results_from_before_fp16_read_as_bf16():
    old = 0
    for path in sorted((REPO / "eval" / "data").glob("*.jsonl")):
        raw = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        says = ["dtypes" in r or any("dtype" in s for s in r["per_shape"]) for r in raw]
        assert raw and len(set(says)) == 1, path  # a file is from before fp16 or after it, not both
        results = [Result.model_validate(r) for r in raw]
        if says[0]:  # from after: each Result names its precisions, and times only the first (its dtype)
            assert all(r.dtype == r.dtypes[0] and all(s.dtype in r.dtypes for s in r.per_shape)
                       and all(s.dtype == r.dtype for s in r.per_shape if s.timing) for r in results), path
            continue
        old += 1  # from before: they say nothing, and read as bf16
        assert all(r.dtypes == ["bfloat16"] and r.dtype == "bfloat16" for r in results), path
        assert all(s.dtype == "bfloat16" for r in results for s in r.per_shape), path
    assert old, "the compare --all file predates fp16"
