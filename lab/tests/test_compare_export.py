"""lab/bench/compare_export.py: compare stores from GPU calls -> one file of Results (repo-relative
kernel paths, the commit and command recorded, a later store's Result replacing an earlier
one of the same task, kernel and precision) and its Markdown tables."""

import json

from lab.bench import compare_export
from epiforge.eval import leaderboard as lb
from epiforge.eval.machine import REPO
from epiforge.eval.result import Result
from lab.bench.rows import load_report
from epiforge.eval.store import ResultStore


def test_stores_become_one_result_per_task_and_kernel(tmp_path):
    shipped = lb.load_shipped_file(lb.SHIPPED_H100)  # k9 there: its expert and a generated kernel
    k9 = [r for r in shipped if r.task == "k9_gemm_partial_cross_entropy"]
    k1 = next(r for r in shipped if r.task == "k1_gemm_rmsnorm")
    first, second = ResultStore(tmp_path / "a.sqlite"), ResultStore(tmp_path / "b.sqlite")
    for r in [*k9, k1]:  # as a GPU machine stores them: absolute paths under its checkout
        first.add(r.model_copy(update={"kernel": str(REPO / r.kernel)}))
    again = k1.model_copy(update={"kernel": "/elsewhere/checkout/" + k1.kernel, "message": "the second run"})
    second.add(again)
    second.add(k1.model_copy(update={"dtypes": ["float16"], "message": "in fp16"}))  # another precision: kept beside
    out, md = tmp_path / "r.jsonl", tmp_path / "r.md"
    assert compare_export.main([str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite"), "--commit", "c1", "c2",
                                "--command", "bash lab/bench/h200.sh judge-compare", "--jsonl", str(out),
                                "--markdown", str(md)]) == 0
    got = [Result.model_validate_json(line) for line in out.read_text().splitlines()]
    # k1 twice (two stores), once in the file: the later store's
    assert sorted((r.task, r.track, r.dtype) for r in got) == sorted(
        [*((r.task, r.track, "bfloat16") for r in [*k9, k1]), ("k1_gemm_rmsnorm", "expert", "float16")])
    k1_out = next(r for r in got if r.task == "k1_gemm_rmsnorm" and r.dtype == "bfloat16")
    assert k1_out.message == "the second run" and k1_out.environment["commit"] == "c2"
    assert len([c for c in compare_export.comparisons(got) if c.task == "k1_gemm_rmsnorm"]) == 2  # one per precision
    assert all(not r.kernel.startswith("/") and (REPO / r.kernel).is_file() for r in got)
    text = md.read_text()
    assert "## k9_gemm_partial_cross_entropy on the GPU" in text and "## k1_gemm_rmsnorm on the GPU" in text
    assert "at commit c1, c2" in text and "| generated:" in text
    assert text.startswith("# epiforge compare at the paper shapes on the ")


def test_the_title_names_the_shape_sets_the_results_ran(tmp_path):
    k1 = next(r for r in lb.load_shipped() if r.task == "k1_gemm_rmsnorm")
    store = ResultStore(tmp_path / "a.sqlite")
    store.add(k1.model_copy(update={"shapes": "coda"}))
    md = tmp_path / "r.md"
    assert compare_export.main([str(tmp_path / "a.sqlite"), "--commit", "c", "--command", "x",
                                "--jsonl", str(tmp_path / "r.jsonl"), "--markdown", str(md)]) == 0
    assert md.read_text().startswith("# epiforge compare at the coda shapes on the ")


def test_agreement_pairs_each_expert_row_with_the_bench_files():
    raw = json.loads((REPO / "lab" / "results" / "h200" / "final.json").read_text())
    rows = compare_export.agreement(lb.load_shipped_file(lb.SHIPPED), load_report(REPO / "lab" / "results" / "h200" / "final.json"))
    bench = {(r["task"], r["shape"]): r for r in raw["rows"]}
    assert len(rows) == len(bench)  # every bench row has its compare row
    for a in rows:
        assert a.bench == bench[(a.task, a.shape)]["fused_over_gemm_only"] and a.compare > 0 and a.cublas > 0
        assert a.fused > 0 and a.bench_clocks is None  # final.json predates the clock sampler


def test_same_session_shows_both_harnesses_clocks(tmp_path):
    """--same-session: the SM clock and power-capped share each harness's timed phase saw,
    from the Results' and the bench file's own timings."""
    from lab.bench.gpu_env import write_report
    from epiforge.eval.clocks import ClockReading, summarize_readings

    shipped = [r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert"]
    judge = summarize_readings([ClockReading(1755.0, 690_000.0, 60.0, 0x0), ClockReading(1785.0, 700_000.0, 61.0, 0x0)])
    bench = summarize_readings([ClockReading(1590.0, 700_000.0, 66.0, 0x4)] * 3 + [ClockReading(1650.0, 600_000.0, 66.0, 0)])

    def with_clocks(t, c):
        return t.model_copy(update={"clocks": c})

    store = ResultStore(tmp_path / "a.sqlite")
    for r in shipped:
        shapes = [s.model_copy(update={"timing": s.timing.model_copy(update={
            "kernel": with_clocks(s.timing.kernel, judge),
            "baselines": {n: with_clocks(b, judge) for n, b in s.timing.baselines.items()}})}) if s.timing else s
            for s in r.per_shape]
        store.add(r.model_copy(update={"per_shape": shapes, "kernel": str(REPO / r.kernel)}))
    final = load_report(REPO / "lab" / "results" / "h200" / "final.json")
    rows = []
    for row in final.rows:
        if row.task != "k8_gemm_swiglu":
            continue
        configs = {k: c.model_copy(update={"fused": with_clocks(c.fused, bench) if c.fused else None})
                   for k, c in row.configs.items()}
        rows.append(row.model_copy(update={"configs": configs, "fused": with_clocks(row.fused, bench)}))
    write_report(tmp_path / "bench.json", final.model_copy(update={"rows": rows}))
    md = tmp_path / "r.md"
    argv = [str(tmp_path / "a.sqlite"), "--commit", "c1", "--command", "x", "--jsonl", str(tmp_path / "r.jsonl"),
            "--markdown", str(md), "--bench", str(tmp_path / "bench.json")]
    assert compare_export.main(argv + ["--same-session"]) == 0
    table = [line for line in md.read_text().splitlines() if line.startswith("| k8_gemm_swiglu |")]
    assert len(table) == 3  # 1B, 7B, 70B
    for line in table:
        assert line.endswith("| 1770 (1755-1785) | 1590 (1590-1650) | 0% | 75% |"), line
    assert compare_export.main(argv) == 0  # runs apart: no clock columns
    assert "SM MHz" not in md.read_text()


def test_install_paths_of_the_gpu_machine_do_not_leave_it():
    tail = ("/opt/torch/.venv/lib/python3.12/site-packages/torch/profiler/profiler.py:224: UserWarning: x\n"
            "  File \"/tmp/gpu/lib/site-packages/quack/gemm.py\", line 3\n")
    got = compare_export.scrub_paths(tail)
    assert "/opt" not in got and "/tmp" not in got
    assert got.startswith("<site-packages>/torch/profiler/profiler.py:224") and '"<site-packages>/quack/gemm.py"' in got
