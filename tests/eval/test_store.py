"""eval/store.py: rows, per-shape timings, ranking, and several writer processes at once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval.result import Outcome, Result, ShapeResult
from eval.store import ResultStore, StoreError

REPO = Path(__file__).resolve().parents[2]


def timing(median, gemm):
    t = {"median_us": median, "q1_us": median * 0.98, "q3_us": median * 1.03, "min_us": median * 0.9, "n": 50}
    g = {"median_us": gemm, "q1_us": gemm, "q3_us": gemm, "min_us": gemm, "n": 50}
    return {"kernel": t, "gemm_only": g, "eager": {**g, "median_us": gemm * 2}, "fused_over_gemm_only": median / gemm,
            "gemm_fraction": gemm / median, "speedup": {"gemm_only": gemm / median, "eager": 2 * gemm / median},
            "roofline": {"floor_us": 1.0}}


def result(outcome="PASSED", kernel="k.py", sha="a" * 64, medians=(110.0, 220.0), track="generated", **kw):
    shapes = [ShapeResult(shape=f"s{i}", dims={"M": 1}, outcome=Outcome(outcome) if outcome in ("PASSED", "IMPLAUSIBLE") else Outcome.PASSED,
                          timing=timing(m, 100.0 * (i + 1)) if m else None) for i, m in enumerate(medians)]
    return Result(task="k1_gemm_rmsnorm", kernel=kernel, kernel_sha256=sha, track=track, backend="anthropic",
                  model="m", device="cuda", shapes="paper", outcome=Outcome(outcome), message="x", per_shape=shapes,
                  environment={"gpu": "H200"}, **kw)


def test_add_and_read_back(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    eid = store.add(result())
    row = store.rows()[0]
    assert row["id"] == eid and row["task"] == "k1_gemm_rmsnorm" and row["kernel_sha256"] == "a" * 64
    assert row["track"] == "generated" and row["backend"] == "anthropic" and row["model"] == "m"
    assert row["ranked"] and row["timed"] and row["worst_fused_over_gemm_only"] == pytest.approx(1.1)
    assert row["environment"] == {"gpu": "H200"} and row["result"]["per_shape"][0]["shape"] == "s0"
    t = store.shape_timings(eid)
    assert [x["shape"] for x in t] == ["s0", "s1"]
    assert t[0]["median_us"] == 110.0 and t[0]["iqr_us"] == pytest.approx(110 * 0.05) and t[0]["n"] == 50
    assert t[1]["gemm_only_median_us"] == 200.0 and t[1]["speedups"]["eager"] == pytest.approx(400 / 220)
    assert t[0]["floor_us"] == 1.0


def test_only_passed_and_timed_results_are_ranked(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    fast = store.add(result(medians=(105.0, 210.0), sha="f" * 64))
    slow = store.add(result(medians=(150.0, 210.0), sha="s" * 64))
    store.add(result("IMPLAUSIBLE", medians=(1.0, 1.0), sha="i" * 64))  # quarantined: timings kept, not ranked
    store.add(result("INCORRECT_NUMERICS", medians=(None, None), sha="n" * 64, worst={"index": [1, 2]}))
    store.add(result(medians=(None, None), sha="c" * 64))  # passed on a CPU: never timed, never ranked
    board = store.leaderboard("k1_gemm_rmsnorm")
    assert [r["id"] for r in board] == [fast, slow]
    imp = store.rows(outcome="IMPLAUSIBLE")[0]
    assert imp["timed"] and not imp["ranked"] and store.shape_timings(imp["id"])
    bad = store.rows(outcome="INCORRECT_NUMERICS")[0]
    assert not bad["timed"] and bad["worst"] == {"index": [1, 2]} and bad["worst_fused_over_gemm_only"] is None
    assert store.count() == 5


def test_path_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EPIFORGE_RESULTS", str(tmp_path / "env.sqlite"))
    ResultStore().add(result())
    assert (tmp_path / "env.sqlite").is_file()


def test_unusable_path_is_one_line(tmp_path):
    (tmp_path / "dir.sqlite").mkdir()
    with pytest.raises(StoreError) as e:
        ResultStore(tmp_path / "dir.sqlite")
    assert "\n" not in str(e.value) and "dir.sqlite" in str(e.value)


# a writer imports eval.store only (no torch): many can start at once, cheaply
WRITER = """
import json, sys
from eval.store import ResultStore
template = json.load(open(sys.argv[4]))
store = ResultStore(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.add({**template, "kernel_sha256": f"{sys.argv[2]}-{i}"})
"""


def test_several_writer_processes_at_once(tmp_path):
    path = tmp_path / "shared.sqlite"
    ResultStore(path)
    template = tmp_path / "result.json"
    template.write_text(json.dumps(result().model_dump(mode="json")))
    n_proc, n_each = 6, 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"w{p}", str(n_each), str(template)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for p in range(n_proc)]
    errors = [p.communicate(timeout=240)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    store = ResultStore(path)
    rows = store.rows()
    assert len(rows) == n_proc * n_each == store.count()
    assert len({r["kernel_sha256"] for r in rows}) == n_proc * n_each and len({r["id"] for r in rows}) == len(rows)
    with store._connect() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM shape_timings").fetchone()[0] == 2 * n_proc * n_each
