"""bench/compare_export.py: compare stores from GPU calls -> one file of Results (repo-relative
kernel paths, the commit and command recorded, a later store's Result replacing an earlier
one of the same task and kernel) and its Markdown tables."""

import json

from bench import compare_export
from eval import leaderboard as lb
from eval.machine import REPO
from eval.result import Result
from eval.store import ResultStore


def test_stores_become_one_result_per_task_and_kernel(tmp_path):
    shipped = lb.load_shipped()
    k8 = [r for r in shipped if r.task == "k8_gemm_swiglu"]
    k1 = next(r for r in shipped if r.task == "k1_gemm_rmsnorm")
    first, second = ResultStore(tmp_path / "a.sqlite"), ResultStore(tmp_path / "b.sqlite")
    for r in [*k8, k1]:  # as a GPU machine stores them: absolute paths under its checkout
        first.add(r.model_copy(update={"kernel": str(REPO / r.kernel)}))
    again = k1.model_copy(update={"kernel": "/elsewhere/checkout/" + k1.kernel, "message": "the second run"})
    second.add(again)
    out, md = tmp_path / "r.jsonl", tmp_path / "r.md"
    assert compare_export.main([str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite"), "--commit", "c1", "c2",
                                "--command", "bash bench/h200.sh judge-compare", "--jsonl", str(out),
                                "--markdown", str(md)]) == 0
    got = [Result.model_validate_json(line) for line in out.read_text().splitlines()]
    # k1 twice (two stores), once in the file: the later store's
    assert sorted((r.task, r.track) for r in got) == sorted((r.task, r.track) for r in [*k8, k1])
    k1_out = next(r for r in got if r.task == "k1_gemm_rmsnorm")
    assert k1_out.message == "the second run" and k1_out.environment["commit"] == "c2"
    assert all(not r.kernel.startswith("/") and (REPO / r.kernel).is_file() for r in got)
    text = md.read_text()
    assert "## k8_gemm_swiglu on the GPU" in text and "## k1_gemm_rmsnorm on the GPU" in text
    assert "at commit c1, c2" in text and "| generated:" in text


def test_agreement_pairs_each_expert_row_with_the_bench_files():
    final = json.loads((REPO / "bench" / "results" / "h200" / "final.json").read_text())
    rows = compare_export.agreement(lb.load_shipped(), final)
    bench = {(r["task"], r["shape"]): r for r in final["rows"]}
    assert len(rows) == len(bench)  # every bench row has its compare row
    for task, shape, ours, theirs, cublas, fused in rows:
        assert theirs == bench[(task, shape)]["fused_over_gemm_only"] and ours > 0 and cublas > 0 and fused > 0
