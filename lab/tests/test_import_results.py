"""lab/bench/import_results.py: bench result files as the evaluator's Results."""

import json

import pytest

from epiforge import tasks
from epiforge.eval.machine import REPO


def test_the_bench_files_numbers_import_as_results():
    """lab/bench/import_results.py: each final.json row becomes a shape of a Result whose ratios the
    evaluator's own factory recomputed from the samples, equal to the file's."""
    from lab.bench.import_results import results_from

    from lab.bench.rows import load_report

    final = json.loads((REPO / "lab" / "results" / "h200" / "final.json").read_text())
    imported = results_from(load_report(REPO / "lab" / "results" / "h200" / "final.json"), None, "final.json")
    assert sorted(tasks.id_of(r.task) for r in imported) == sorted(tasks.CODA_TASKS)
    for row in final["rows"]:
        (r,) = [x for x in imported if x.task == row["task"]]
        (s,) = [x for x in r.per_shape if x.shape == row["shape"]]
        assert s.timing.fused_over_gemm_only.median == pytest.approx(row["fused_over_gemm_only"], rel=1e-9)
        assert s.timing.speedup["torch_compile"].median == pytest.approx(row["speedup_vs_compile"], rel=1e-9)
