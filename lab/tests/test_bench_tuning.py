"""bench.tuning turns a sweep's timings into the TUNED tables the kernels carry."""

import json
import shutil
from pathlib import Path

import pytest

from epiforge import primitives as P
from lab.bench import tuning

REPO = Path(__file__).resolve().parents[2]


def _s(samples):
    """A Timing with these samples, in repetition order."""
    from epiforge.eval.timing import summarize

    return summarize(samples, keep=True)


def _t(us, drift=(1.0,) * 5):
    """A Timing whose repetitions took us x each drift factor."""
    return _s([us * d for d in drift])


def _row(task="k8_gemm_swiglu", configs=None, gemm_cublas=None, **timed):
    """A bench row from timings, by the one factory (lab.bench.rows.BenchRow.measured);
    configs: {key: {what: Timing}}."""
    from lab.bench.rows import BenchRow, ConfigTimings

    return BenchRow.measured(task=task, shape="1B", dims={"M": 16384, "d": 2048, "F": 5632},
                             gemm_mnk=(16384, 11264, 2048), flops=1.0, min_bytes=1.0,
                             configs={k: ConfigTimings(**v) for k, v in (configs or {}).items()},
                             gemm_cublas=gemm_cublas or _t(1000.0), **timed)


def _write(path, rows, environment=None):
    from lab.bench.gpu_env import write_report
    from lab.bench.rows import BenchReport

    write_report(path, BenchReport(environment=environment or {}, rows=rows))
    return str(path)


def _sweep(tmp_path):
    rows = [_row("k8_gemm_swiglu", gemm_cublas=_t(100.0), configs={
        "128x192_c2x1_pp": {"fused": _t(110.0), "gemm_quack": _t(98.0)},
        "128x128_c1x2_pp": {"fused": _t(104.0), "gemm_quack": _t(101.0)},
        "256x192_c1x2": {"errors": {"fused": "RuntimeError: does not fit"}},
    }), _row("k2_gemm_rmsnorm_swiglu", gemm_cublas=_t(100.0), configs={
        "128x192_c2x1_pp": {"fused": _t(101.0), "gemm_quack": _t(99.0), "quack_library": _t(120.0)},
        "128x96_c2x1_pp": {"fused": _t(130.0), "gemm_quack": _t(99.0), "quack_library": _t(105.0)},
    })]
    return _write(tmp_path / "sweep.json", rows)


def test_best_config_is_the_lowest_ratio_to_the_fastest_gemm(tmp_path):
    best = tuning.best_configs([_sweep(tmp_path)])
    cfg, ratio = best["k8_gemm_swiglu"]["16384x11264x2048"]
    assert cfg == "128x128_c1x2_pp" and abs(ratio - 104.0 / 98.0) < 1e-12
    lib = tuning.best_configs([_sweep(tmp_path)], "quack_library")
    assert lib == {"k2_gemm_rmsnorm_swiglu": {"16384x11264x2048": ("128x96_c2x1_pp", 105.0 / 99.0)}}


def test_written_tables_are_what_pick_config_reads(tmp_path):
    kernel = tmp_path / "k8.py"
    shutil.copy(REPO / "human_kernels" / "k8_gemm_swiglu.py", kernel)
    library = tmp_path / "quack_library.py"
    shutil.copy(REPO / "eval" / "quack_library.py", library)
    sweep = _sweep(tmp_path)
    tuning.write_kernel_table(kernel, tuning.best_configs([sweep])["k8_gemm_swiglu"], ["runs/a.json", "runs/b.json"])
    tuning.write_library_table(library, "k2_gemm_rmsnorm_swiglu",
                               tuning.best_configs([sweep], "quack_library")["k2_gemm_rmsnorm_swiglu"], ["runs/c.json"])
    # each table says which sweeps it came from, right above it
    assert tuning.provenance(["runs/a.json", "runs/b.json"]) + "\nTUNED = {" in kernel.read_text()
    assert tuning.provenance(["runs/c.json"]) + "\nTUNED = {" in library.read_text()
    ns, lib_ns = {}, {}
    exec(compile(kernel.read_text(), str(kernel), "exec"), ns)  # noqa: S102 - our own file
    exec(compile(library.read_text(), str(library), "exec"), lib_ns)  # noqa: S102
    import torch

    a, w = torch.empty(16384, 2048, device="meta"), torch.empty(11264, 2048, device="meta")
    assert P.pick_config(ns["TUNED"], a, w).key() == "128x128_c1x2_pp"
    assert P.pick_config(lib_ns["TUNED"]["k2_gemm_rmsnorm_swiglu"], a, w).key() == "128x96_c2x1_pp"
    from epiforge.eval.quack_library import TUNED as before

    k6 = "k6_gemm_residual_partial_rmsnorm_bwd"
    assert lib_ns["TUNED"][k6] == before[k6]  # the other entries untouched


def test_speed_of_light_is_the_fastest_plain_gemm_measured():
    row = _row(configs={"c": {"fused": _t(110.0), "gemm_quack": _t(105.0), "quack_library": _t(121.0)}},
               gemm_cublas=_t(120.0), gemm_quack_candidates={"best": _t(100.0)}, torch_compile=_t(150.0))
    assert row.gemm_only_us == 100.0 and row.gemm_only_is == "gemm_quack_best"
    assert abs(row.fused_over_gemm_only - 1.1) < 1e-12
    assert abs(row.fraction_of_bound - (150 / 110) / (150 / 100)) < 1e-12
    assert abs(row.speedup_vs_quack_library - 1.1) < 1e-12
    row = _row(configs={"c": {"fused": _t(110.0), "gemm_quack": _t(105.0)}}, gemm_cublas=_t(120.0))
    assert row.gemm_only_us == 105.0 and row.gemm_only_is == "gemm_quack"


def test_ratios_are_taken_repetition_by_repetition():
    # the clock falls during the run; the fused kernel ran at the slow end of each repetition's
    # drift as often as the GEMM did, 10% slower than it in every repetition
    drift = (1.0, 1.1, 1.2, 1.3, 1.4)
    row = _row(configs={"c": {"fused": _t(110.0, drift), "gemm_quack": _t(100.0, drift)}},
               gemm_cublas=_t(120.0, drift), torch_compile=_t(150.0, drift))
    assert abs(row.fused_over_gemm_only - 1.1) < 1e-12 and abs(row.fused_over_gemm_only_iqr[1] - 1.1) < 1e-12
    assert abs(row.speedup_vs_compile - 150 / 110) < 1e-12 and abs(row.fraction_of_bound - 1 / 1.1) < 1e-12
    # paired against a GEMM whose drift ran the other way, the ratios spread around the same median
    row = _row(configs={"c": {"fused": _t(110.0, drift), "gemm_quack": _t(100.0, drift[::-1])}},
               gemm_cublas=_t(120.0, drift[::-1]))
    lo, hi = row.fused_over_gemm_only_iqr
    assert lo < 1.0 and hi > 1.3 and abs(row.fused_over_gemm_only_of_medians - 1.1) < 1e-12
    # where the two disagree, the per-repetition ratio is the one reported
    row = _row(configs={"c": {"fused": _s(PAIRED_SLOWER)}}, gemm_cublas=_s(CLOCK))
    assert row.fused_over_gemm_only_of_medians == 1.0 and abs(row.fused_over_gemm_only - 1.1) < 1e-12


# a GEMM whose clock wanders over five repetitions, and two kernels: one 5% slower than it in
# every repetition, one that by median time looks as fast as the GEMM but is 10% slower in
# three of the five repetitions (its fast repetitions fell where the GEMM was slow)
CLOCK = [90.0, 95.0, 100.0, 105.0, 110.0]
PAIRED_FASTER = [1.05 * x for x in CLOCK]
PAIRED_SLOWER = [99.0, 104.5, 110.0, 90.0, 100.0]



def test_configs_are_ranked_repetition_by_repetition():
    row = _row(configs={"a": {"fused": _s(PAIRED_FASTER)}, "b": {"fused": _s(PAIRED_SLOWER)}}, gemm_cublas=_s(CLOCK))
    assert row.configs["b"].fused.median_us < row.configs["a"].fused.median_us
    assert row.fastest_configs("fused", 2) == ["a", "b"] and row.best_config == "a"
    bare = row.model_copy(update={  # a file from before samples were kept: by median time
        "gemm_cublas": row.gemm_cublas.model_copy(update={"samples_us": []}),
        "configs": {k: c.model_copy(update={"fused": c.fused.model_copy(update={"samples_us": []})})
                    for k, c in row.configs.items()}})
    assert bare.fastest_configs("fused", 2) == ["b", "a"]


def test_chain_gemm_only_adds_the_two_gemms_repetition_by_repetition():
    from lab.bench.rows import ChainRow

    k7, k6 = [60.0, 50.0, 60.0, 50.0, 60.0], [40.0, 50.0, 40.0, 50.0, 40.0]  # 100 us together in every repetition
    timed = {name: _s(v) for name, v in {
        "k7_gemm@cublas": [x * 1.1 for x in k7], "k7_gemm@128x128": k7,
        "k6_gemm@cublas": [x * 1.2 for x in k6], "k6_gemm@128x128": k6,
        "fused": [110.0] * 5, "torch_compile": [150.0] * 5, "fused@k7=c": [121.0] * 5}.items()}
    r = ChainRow.measured(shape="1B", dims={"M": 5}, configs={"k7": "a", "k6": "b"}, timings=timed,
                          max_rel_diff_fused_vs_compiled={"dz": 0.0})
    assert r.variants_over_fused == {"k7=c": pytest.approx(1.1)}  # another fused chain, per repetition
    assert r.gemm_only_us == 100.0 and abs(r.fused_over_gemm_only - 1.1) < 1e-12
    assert r.fused_over_gemm_only_iqr == (pytest.approx(1.1),) * 2  # per-repetition sums: no spread
    assert abs(r.bound - 1.5) < 1e-12 and abs(r.speedup_vs_compile - 150 / 110) < 1e-12


ENV = {k: "x" for k in ("gpu", "command", "date", "torch", "cuda", "nvidia-cutlass-dsl", "quack-kernels", "triton",
                        "driver", "python")}


@pytest.mark.spawns
def test_rederive_recomputes_ratios_from_samples_and_refuses_files_without(tmp_path):
    from lab.bench.report import main as report_main

    row = _row(configs={"c": {"fused": _s(PAIRED_SLOWER), "gemm_quack": _s([x * 1.2 for x in CLOCK])}},
               gemm_cublas=_s(CLOCK))
    f = _write(tmp_path / "final.json", [row], ENV)
    stale = json.loads(Path(f).read_text())
    stale["rows"][0]["fused_over_gemm_only"] = 1.0  # as an older definition left it
    Path(f).write_text(json.dumps(stale))
    assert report_main([f, "--rederive", "--out", str(tmp_path / "README.md")]) == 0
    again = json.loads(Path(f).read_text())
    assert abs(again["rows"][0]["fused_over_gemm_only"] - 1.1) < 1e-12 and "rederived" in again
    assert "| 1.100 (" in (tmp_path / "README.md").read_text()
    for where in (stale["rows"][0], stale["rows"][0]["configs"]["c"]):
        where["gemm_quack"]["samples_us"] = []  # a file from before samples were kept
    Path(f).write_text(json.dumps(stale))
    with pytest.raises(SystemExit) as e:
        report_main([f, "--rederive"])
    assert e.value.code == 2 and json.loads(Path(f).read_text())["rows"][0]["fused_over_gemm_only"] == 1.0  # untouched


def test_diagnostics_are_reported_against_the_same_speed_of_light():
    from lab.bench.report import markdown
    from lab.bench.rows import BenchReport

    row = _row("k7_gemm_partial_swiglu_bwd", gemm_cublas=_t(110.0), diagnostic_notes={"without_zdz": "no ZdZ"},
               configs={"128x128_c1x2_pp": {"fused": _t(130.0), "gemm_quack": _t(100.0),
                                            "diagnostics": {"without_zdz": _t(115.0)}}})
    d = row.diagnostics["without_zdz"]
    assert abs(d.over_gemm_only - 1.15) < 1e-12 and d.config == "128x128_c1x2_pp" and d.median_us == 115.0
    text = markdown([BenchReport(environment=ENV, rows=[row])])
    assert "without_zdz (no ZdZ) at 128x128_c1x2_pp: 1.150 of GEMM-only, the kernel 1.300" in text
    assert "| 128x128_c1x2_pp | 1.300 (1.300-1.300) |" in text  # the per-repetition ratios' quartiles


@pytest.mark.spawns
def test_results_name_the_commit_they_came_from(monkeypatch, tmp_path):
    import re

    from lab.bench import gpu_env

    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", gpu_env.source_commit())
    # a machine that received the working tree without .git, or with a stale one: the caller's stamp wins
    monkeypatch.setenv("EPIFORGE_COMMIT", "abc123")
    assert gpu_env.source_commit(tmp_path) == "abc123" and gpu_env.source_commit() == "abc123"


def test_confirmation_run_takes_the_sweeps_fastest_configs(tmp_path):
    """--configs-from --top N re-times a row at its sweep's N fastest fused configs (those
    that ran), fastest first; --top without --configs-from is refused before any GPU work."""
    from lab.bench import run
    from lab.bench.rows import load_report

    rows = load_report(_sweep(tmp_path)).rows
    assert rows[0].fastest_configs("fused", 3) == ["128x128_c1x2_pp", "128x192_c2x1_pp"]
    assert rows[1].fastest_configs("fused", 1) == ["128x192_c2x1_pp"]
    assert rows[0].configs["256x192_c1x2"].errors == {"fused": "RuntimeError: does not fit"}
    with pytest.raises(SystemExit):
        run.main(["--top", "3", "--out", str(tmp_path / "x.json")])


def test_library_pick_names_the_config_the_library_ran_at(tmp_path):
    """In a confirmation run the library runs once, at its own config, recorded beside the
    fused kernel's first config: its TUNED entry must name the library's config."""
    row = _row("k2_gemm_rmsnorm_swiglu", gemm_cublas=_t(100.0), gemm_quack_candidates={"128x96_c2x1_pp": _t(95.0)},
               configs={"128x128_c1x2_pp": {"fused": _t(99.0), "gemm_quack": _t(97.0), "quack_library": _t(98.0),
                                            "quack_library_config": "128x96_c2x1_pp"},
                        "128x160_c1x2_pp": {"fused": _t(101.0), "gemm_quack": _t(99.0)}})
    assert row.quack_library_config == "128x96_c2x1_pp"
    f = _write(tmp_path / "confirm.json", [row])
    lib = tuning.best_configs([str(f)], "quack_library")["k2_gemm_rmsnorm_swiglu"]["16384x11264x2048"]
    assert lib[0] == "128x96_c2x1_pp" and lib[1] == pytest.approx(98.0 / 95.0)  # against the fastest plain GEMM
    fused = tuning.best_configs([str(f)])["k2_gemm_rmsnorm_swiglu"]["16384x11264x2048"]
    assert fused[0] == "128x128_c1x2_pp" and fused[1] == pytest.approx(99.0 / 95.0)


@pytest.mark.spawns
def test_h200_pipeline_script_parses_and_refuses_unknown_steps():
    import subprocess

    script = REPO / "lab" / "bench" / "h200.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    out = subprocess.run(["bash", str(script), "sweep"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage: lab/bench/h200.sh confirm|final|rerun|profile" in out.stderr


def test_result_files_keep_each_list_of_samples_on_one_line():
    from lab.bench.gpu_env import report_json

    report = {"rows": [{"fused": _t(110.0, (1.0, 1.25, 0.5)).model_dump(), "configs": {"128x128": {}},
                        "names": ["a", "b"]}],
              "nested": [[1, -2.5e-05], []]}
    text = report_json(report)
    assert json.loads(text) == report
    assert '"samples_us": [110.0, 137.5, 55.0]' in text and "[1, -2.5e-05]" in text
    assert '"names": [\n' in text  # only numbers are joined


def test_a_library_that_does_less_is_compared_with_the_kernel_minus_that_work():
    from lab.bench.report import _verdict

    k6 = "k6_gemm_residual_partial_rmsnorm_bwd"  # quack's rms_bwd_apply_epi does not store h

    def row(without_h_us, like_for_like="without_h"):
        return _row(k6, gemm_cublas=_t(120.0), diagnostic_notes={"without_h": "no h"}, like_for_like=like_for_like,
                    configs={"c": {"fused": _t(104.0), "gemm_quack": _t(100.0), "quack_library": _t(101.0),
                                   "diagnostics": {"without_h": _t(without_h_us)}}})

    r = row(101.5)
    assert abs(r.speedup_vs_quack_library - 101 / 104) < 1e-12
    assert r.quack_library_like_for_like == "without_h"
    assert abs(r.speedup_vs_quack_library_like_for_like - 101 / 101.5) < 1e-12
    assert _verdict(r) == "met"
    assert _verdict(row(104.0)) == "MISSED: 0.97x of quack's library epilogue"
    alone = row(101.5, like_for_like=None)  # no like-for-like diagnostic: the kernel itself is compared
    assert alone.quack_library_like_for_like is None and _verdict(alone) == "MISSED: 0.97x of quack's library epilogue"


def test_check_says_where_the_tables_differ_from_the_data_and_by_how_much(tmp_path, monkeypatch):
    kernels = tmp_path / "human_kernels"
    kernels.mkdir()
    for task, cfg in (("k8_gemm_swiglu", "128x192_c2x1_pp"), ("k2_gemm_rmsnorm_swiglu", "128x192_c2x1_pp")):
        (kernels / f"{task}.py").write_text(f'X = 1\nTUNED = {{\n    "16384x11264x2048": "{cfg}",  # old\n}}\n')
    monkeypatch.setattr(tuning, "REPO", tmp_path)
    lines = tuning.check([_sweep(tmp_path)])
    # k8: the table says 128x192 (110 us), the data picks 128x128 (104 us); k2's table agrees with its data
    assert lines == ["k8_gemm_swiglu 16384x11264x2048: TUNED 128x192_c2x1_pp, these files pick 128x128_c1x2_pp, "
                     f"{110 / 104 - 1:.2%} faster",
                     f"1 of 2 entries differ; the picks ran at most {110 / 104 - 1:.2%} faster (median {110 / 104 - 1:.2%})"]
    assert tuning.main([_sweep(tmp_path), "--check"]) == 0
    assert "X = 1" in (kernels / "k8_gemm_swiglu.py").read_text() and '"128x192_c2x1_pp"' in (kernels / "k8_gemm_swiglu.py").read_text()


def test_ratios_lists_every_config_fastest_first(tmp_path, capsys):
    assert tuning.main([_sweep(tmp_path), "--ratios"]) == 0
    out = capsys.readouterr().out
    assert f"k8_gemm_swiglu 16384x11264x2048: 128x128_c1x2_pp {104 / 98:.3f}, 128x192_c2x1_pp {110 / 98:.3f}" in out
    with pytest.raises(SystemExit):
        tuning.main([_sweep(tmp_path), "--ratios", "--write"])


def test_a_file_that_is_not_a_result_is_one_line_before_any_gpu_work(tmp_path, capsys):
    from lab.bench import report, run
    from lab.bench.rows import load_report

    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"rows": 3}')
    (tmp_path / "chain.json").write_text('{"rows": [{"shape": "1B"}]}')
    for name, says in (("missing.json", "cannot read it"), ("broken.json", "not JSON"), ("other.json", "not a result file")):
        with pytest.raises(ValueError, match=says):
            load_report(tmp_path / name)
    for main, argv, says in ((tuning.main, [str(tmp_path / "chain.json")], "not a bench.run result"),
                             (tuning.main, [str(tmp_path / "missing.json"), "--check"], "cannot read it"),
                             (run.main, ["--configs-from", str(tmp_path / "broken.json"), "--out", str(tmp_path / "x")],
                              "not JSON"),
                             (report.main, [str(tmp_path / "other.json")], "not a result file")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and says in err[-1], err


def test_a_flag_is_set_beside_its_twin_repetition_by_repetition(tmp_path, capsys):
    """--pairs: a flagged config over its twin without the flag, per repetition and per file:
    the kernel whose median time looks like its twin's but is 10% slower where paired
    shows 1.1; a row without the twin, or a file without the row, shows none."""
    row = _row(configs={"a": {"fused": _s(CLOCK)}, "a_cl": {"fused": _s(PAIRED_SLOWER)},
                        "b_cl": {"fused": _s(PAIRED_FASTER)}}, gemm_cublas=_s(CLOCK))
    first = _write(tmp_path / "one.json", [row])
    second = _write(tmp_path / "two.json", [_row(task="k1_gemm_rmsnorm", configs={"a": {"fused": _s(CLOCK)}})])
    pairs = tuning.flag_pairs([first, second], "_cl")
    assert [(t, twin) for t, _, twin, _ in pairs] == [("k8_gemm_swiglu", "a"), ("k8_gemm_swiglu", "b")]
    (_, _, _, (a1, a2)), (_, _, _, (b1, b2)) = pairs
    assert abs(a1 - 1.1) < 1e-12 and a2 is None and b1 is None and b2 is None
    assert tuning.main([first, "--pairs", "_cl"]) == 0
    assert "| k8_gemm_swiglu | 1B | a | 1.100 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        tuning.main([first, "--pairs", "_zz"])
    assert e.value.code == 2 and "no config key holds it" in capsys.readouterr().err
    # a flag's key part before another's: the twin is the key without it
    middle = _write(tmp_path / "three.json", [_row(configs={"a_cl": {"fused": _s(CLOCK)},
                                                             "a_en64_cl": {"fused": _s(PAIRED_SLOWER)}},
                                                    gemm_cublas=_s(CLOCK))])
    ((_, _, twin, (ratio,)),) = tuning.flag_pairs([middle], "_en64")
    assert twin == "a_cl" and abs(ratio - 1.1) < 1e-12


def test_picks_set_each_shapes_tuned_config_beside_the_fastest_here_and_on_another_card(tmp_path, capsys):
    kernels = tmp_path / "human_kernels"
    kernels.mkdir()
    # k8 has its own entry for the shape; k2's table knows only a neighbour, so pick_config takes it
    (kernels / "k8_gemm_swiglu.py").write_text('TUNED = {\n    "16384x11264x2048": "128x192_c2x1_pp",\n}\n')
    (kernels / "k2_gemm_rmsnorm_swiglu.py").write_text('TUNED = {\n    "16384x22016x2048": "128x96_c2x1_pp",\n}\n')
    here = _sweep(tmp_path)
    there_dir = tmp_path / "there"
    there_dir.mkdir()
    there = _write(there_dir / "sweep.json", [_row("k8_gemm_swiglu", gemm_cublas=_t(100.0), configs={
        "128x192_c2x1_pp": {"fused": _t(103.0), "gemm_quack": _t(100.0)},
        "128x128_c1x2_pp": {"fused": _t(180.0), "gemm_quack": _t(100.0)},
    })])
    rows = tuning.tuned_picks([here], [there], kernels_dir=kernels)
    assert rows == [
        ("k2_gemm_rmsnorm_swiglu", "16384x11264x2048", "128x96_c2x1_pp", False, pytest.approx(130 / 99),
         "128x192_c2x1_pp", pytest.approx(101 / 99), None, None),
        ("k8_gemm_swiglu", "16384x11264x2048", "128x192_c2x1_pp", True, pytest.approx(110 / 98),
         "128x128_c1x2_pp", pytest.approx(104 / 98), pytest.approx(1.03), pytest.approx(1.80)),
    ]
    table = tuning.picks_table(rows, other=True)
    assert "| 128x96_c2x1_pp (nearest entry) | 1.313 | 1.020 (128x192_c2x1_pp) | - | - |" in table
    assert table.splitlines()[1].count("---") == table.splitlines()[0].count(" | ") + 1
    with pytest.raises(SystemExit):
        tuning.main([here, "--other", there])  # --other without --picks


def test_ratios_of_another_timing_and_only_with_ratios(tmp_path, capsys):
    assert tuning.main([_sweep(tmp_path), "--ratios", "--of", "quack_library"]) == 0
    out = capsys.readouterr().out
    # k2's library ran at both configs: 105 and 120 us against the fastest plain GEMM, 99 us
    assert f"k2_gemm_rmsnorm_swiglu 16384x11264x2048: 128x96_c2x1_pp {105 / 99:.3f}, 128x192_c2x1_pp {120 / 99:.3f}" in out
    assert "k8_gemm_swiglu" not in out  # no library timing there
    with pytest.raises(SystemExit):
        tuning.main([_sweep(tmp_path), "--of", "quack_library"])
    for bad in ("nonsense", "diag:never_measured"):  # one line, not a traceback
        with pytest.raises(SystemExit) as e:
            tuning.main([_sweep(tmp_path), "--ratios", "--of", bad])
        assert e.value.code == 2 and bad in capsys.readouterr().err


def test_picks_of_a_task_without_a_kernel_file_is_one_line(tmp_path, capsys):
    sweep = _write(tmp_path / "sweep.json", [_row("k99_no_such_kernel", gemm_cublas=_t(100.0), configs={
        "128x128_c1x2_pp": {"fused": _t(104.0), "gemm_quack": _t(101.0)}})])
    with pytest.raises(SystemExit) as e:
        tuning.main([sweep, "--picks"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "k99_no_such_kernel.py" in err and "Traceback" not in err
