"""lab/bench/rows.py: lab/bench/'s result rows as models. Every committed bench.run and bench.chain
file under lab/results/h200 loads (earlier layouts migrated), keeps its numbers, and the
factory derives the rederived files' ratios again from their samples; the schema refuses rows
whose parts disagree."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from lab.bench.rows import BenchReport, BenchRow, ChainReport, CheckReport, load_report

RESULTS = Path(__file__).resolve().parents[2] / "lab" / "results" / "h200"


def _made_by(raw: dict) -> str:
    """The module a result file says made it (its environment's command)."""
    return ((raw.get("environment") or {}).get("command") or "").removeprefix("python -m ").removeprefix("epiforge.").removeprefix("lab.").split(" ")[0]


COMMITTED = {p.name: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
ROWS_FILES = {name: raw for name, raw in COMMITTED.items() if _made_by(raw) in ("bench.run", "bench.chain")}


def test_there_are_bench_files_of_both_kinds():
    assert {_made_by(raw) for raw in ROWS_FILES.values()} == {"bench.run", "bench.chain"}


@pytest.mark.parametrize("name", sorted(ROWS_FILES))
def test_every_committed_file_loads_with_its_numbers(name):
    raw = ROWS_FILES[name]
    report = load_report(RESULTS / name)
    assert isinstance(report, ChainReport if _made_by(raw) == "bench.chain" else BenchReport)
    assert len(report.rows) == len(raw["rows"]) and report.environment == raw["environment"]
    for row, old in zip(report.rows, raw["rows"]):
        assert row.fused_over_gemm_only == old.get("fused_over_gemm_only") and row.shape == old["shape"]
        if isinstance(row, BenchRow):
            # the earlier layout's "diag_<name>" and "<what>_error" keys land under diagnostics and errors
            for key, entry in old["configs"].items():
                cfg = row.configs[key]
                assert {f"diag_{n}" for n in cfg.diagnostics} == {k for k in entry if k.startswith("diag_")}
                assert {f"{w}_error" for w in cfg.errors} == {k for k in entry if k.endswith("_error")}
                assert (cfg.fused and cfg.fused.median_us) == (entry.get("fused") or {}).get("median_us")
            assert {f"{w}_error" for w in row.errors} == {k for k in old if k.endswith("_error")}


@pytest.mark.parametrize("name", ["final.json", "final-2.json"])
def test_the_factory_derives_the_rederived_files_ratios_again(name):
    """final.json and final-2.json (what the README and the leaderboard's import quote) were
    rederived from their samples: the factory, run again on them, gives every ratio back."""
    from epiforge.eval.quack_library import LIKE_FOR_LIKE

    report = load_report(RESULTS / name)
    assert report.rederived and all(r.fused is not None for r in report.rows)
    for row in report.rows:
        again = row.rederived(LIKE_FOR_LIKE.get(row.task))
        assert again == row, f"{row.task} {row.shape}"


def test_rows_whose_parts_disagree_are_refused():
    raw = json.loads(json.dumps(COMMITTED["confirm.json"]["rows"][0]))  # three configs, torch.compile timed
    BenchRow.model_validate(raw)
    other = next(k for k in raw["configs"] if k != raw["best_config"])
    for broken in ({**raw, "best_config": other},                                  # fused is not the one at that config
                   {**raw, "gemm_only_is": "liger"},                                # not a plain GEMM
                   {**raw, "gemm_only_us": raw["gemm_only_us"] * 2},                # not the speed of light's median
                   {k: v for k, v in raw.items() if k != "torch_compile"},          # a speedup without its baseline
                   {**raw, "fused_over_gemm_only": -1.0},                           # a ratio is positive
                   {**raw, "surprise": 1}):                                         # no field the schema does not name
        with pytest.raises(ValidationError):
            BenchRow.model_validate(broken)


def test_a_file_of_other_rows_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"check.json: not a bench.run result \(rows.0"):
        load_report(RESULTS / "check.json")
    with pytest.raises(ValueError, match="not a bench.run result .its rows are bench.chain's"):
        load_report(RESULTS / "chain.json", BenchReport)


@pytest.mark.parametrize("name", ["check.json", "check-logits.json", "check-qkn.json", "check-rope.json"])
def test_every_committed_gpu_check_file_loads_as_a_check_report(name):
    report = CheckReport.load(RESULTS / name)
    raw = json.loads((RESULTS / name).read_text())
    assert len(report.rows) == len(raw["rows"]) > 0
    assert report.all_passed == all(r.outcome == "PASSED" for r in report.rows)
    for row, r in zip(report.rows, raw["rows"]):
        assert row.launches_ok == (row.outcome == "PASSED" and (row.hidden or bool(row.launch_names))), r["task"]
        assert [c.name for c in row.outputs] == [c["name"] for c in r["outputs"]]


def test_a_bench_file_is_not_a_check_report():
    with pytest.raises(ValueError, match=r"final.json: not a bench.check_gpu result"):
        CheckReport.load(RESULTS / "final.json")


@pytest.mark.parametrize("argv, line", [
    (["--shape-set", "nope"], "--shape-set 'nope': not in tasks/shapes.toml"),
    (["--shape-set", "llama1b", "--scales", "1B"], "--scales 1B: not in the llama1b set (llama1b)"),
])
def test_bench_run_refuses_a_shape_set_or_scale_it_does_not_have(argv, line, capsys, tmp_path):
    """lab/bench/run.py --shape-set picks a tasks/shapes.toml set; a bad one, or a scale outside it,
    is one line before any GPU work (nothing written)."""
    from lab.bench import run

    with pytest.raises(SystemExit) as stop:
        run.main([*argv, "--out", str(tmp_path / "out.json")])
    assert stop.value.code == 2 and line in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_the_llama3_set_is_the_training_benchmarks_layers():
    from epiforge import tasks
    from lab.bench.training import BATCH, LAYERS, SEQ

    rows = tasks.shape_sets()["llama3"]
    assert [(r.M, r.seq, r.d, r.F, r.head_dim) for r in rows] == [
        (BATCH * SEQ, SEQ, c.d, c.ffn, c.head_dim) for c in LAYERS.values()]


@pytest.mark.parametrize("argv, line", [
    (["--tasks", "k0", "k2", "--gemm-k", "F"], "--gemm-k: k2: its GEMM's k (d) is not its n (2*F)"),
    (["--tasks", "layer", "--gemm-k", "F"], "--gemm-k: layer: it has several fused GEMMs"),
    (["--tasks", "k0", "--gemm-k", "G"], "--gemm-k 'G': unknown dimension(s) G"),
    (["--tasks", "k0", "--gemm-k", "d-d"], "--gemm-k 'd-d' is not a positive multiple of 8 at every shape"),
    (["--tasks", "k0", "--gemm-k", "F+1"], "--gemm-k 'F+1' is not a positive multiple of 8 at every shape"),
    (["--tasks", "k0", "--gemm-k", "True"], "--gemm-k 'True'"),
    (["--tasks", "k0", "--gemm-k", "F", "--liger"], "--gemm-k times the kernel and the plain GEMMs"),
])
def test_bench_run_refuses_a_gemm_k_it_cannot_honour(argv, line, capsys, tmp_path):
    from lab.bench import run

    with pytest.raises(SystemExit) as stop:
        run.main([*argv, "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and line in err and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_gemm_k_makes_k0_the_down_projection_and_its_expert_kernel_computes_it():
    """k0 at K = F: A (M, F) and B (d, F), everything else as the task makes it; the expert
    kernel (on the CPU, the emulator) agrees with the task's float64 reference there, so a
    --gemm-k row times the down projection's real work."""
    import torch

    from epiforge import tasks
    from lab.bench.run import gemm_k_refusal, inputs_at_gemm_k
    from epiforge.eval.kernel import expert_kernel, load_kernel_module

    task = tasks.get_task("k0")
    assert gemm_k_refusal(task) is None
    assert "is not its n (3*d)" in gemm_k_refusal(tasks.get_task("k1"))  # the QKV projection: N = 3d
    dims = tasks.shape_sets()["smoke"][1].dims()
    k = dims["F"]
    inputs = inputs_at_gemm_k(task, dims, k, seed=4, device="cpu")
    plain = task.make_inputs(dims, seed=4, device="cpu")
    assert tuple(inputs["a"].shape) == (dims["M"], k) and tuple(inputs["w_o"].shape) == (dims["d"], k)
    assert inputs["a"].dtype == plain["a"].dtype and k != dims["d"]
    assert all(torch.equal(inputs[n], plain[n]) for n in ("residual", "norm_weight"))
    got = load_kernel_module(expert_kernel(task.name)).run(inputs, {})
    want = task.reference(inputs, dims)
    for name in ("x", "h", "rstd"):
        err = (got[name].double() - want[name].double()).abs().max().item()
        assert err <= 0.05 * want[name].double().abs().max().item(), (name, err)


def test_the_llama1b_set_is_llama_3_2_1b_as_the_training_benchmark_runs_it():
    from epiforge import tasks
    from lab.bench.training import BATCH, MODEL_1B, SEQ

    (row,) = tasks.shape_sets()["llama1b"]
    assert (row.M, row.seq, row.d, row.F, row.V, row.head_dim) == (
        BATCH * SEQ, SEQ, MODEL_1B.layer.d, MODEL_1B.layer.ffn, MODEL_1B.vocab, MODEL_1B.layer.head_dim)
