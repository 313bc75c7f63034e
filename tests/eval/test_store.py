"""eval/store.py: rows, per-shape timings, ranking, and several writer processes at once."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epiforge.eval.result import Outcome, Result, ShapeResult, ShapeTiming
from epiforge.eval.stats import summarize
from epiforge.eval.store import ResultStore, StoreError

REPO = Path(__file__).resolve().parents[2]


def timing(median, gemm):
    """A ShapeTiming from three repetitions of one run: the kernel at `median`, GEMM-only at `gemm`."""
    return ShapeTiming.measured({"kernel": summarize([median * 0.98, median, median * 1.03], keep=True),
                                 "gemm_only": summarize([gemm, gemm, gemm], keep=True),
                                 "eager": summarize([2 * gemm] * 3, keep=True)}, roofline={"floor_us": 1.0})


def result(outcome="PASSED", kernel="k.py", sha="a" * 64, medians=(110.0, 220.0), track="generated", **kw):
    shapes = [ShapeResult(shape=f"s{i}", dims={"M": 1}, outcome=Outcome(outcome) if outcome in ("PASSED", "IMPLAUSIBLE") else Outcome.PASSED,
                          timing=timing(m, 100.0 * (i + 1)) if m else None) for i, m in enumerate(medians)]
    base = dict(task="k1_gemm_rmsnorm", kernel=kernel, kernel_sha256=sha, track=track, backend="anthropic",
                model="m", device="cuda", shapes="paper", environment={"gpu": "H200"})
    return Result.judged(base, Outcome(outcome), "done" if outcome == "PASSED" else "plausibility", "x", shapes, **kw)


def test_add_and_read_back(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    given = result()
    eid = store.add(given)
    (row,) = store.rows()
    assert row.id == eid and row.result == given  # the row IS the Result
    assert row.result.ranked and row.result.timed
    t = store.shape_timings(eid)
    assert [x["shape"] for x in t] == ["s0", "s1"]
    assert t[0]["median_us"] == 110.0 and t[0]["iqr_us"] == pytest.approx(given.per_shape[0].timing.kernel.iqr_us)
    assert t[1]["gemm_only_median_us"] == 200.0 and t[1]["speedups"]["eager"] == pytest.approx(400 / 220)
    assert t[0]["floor_us"] == 1.0 and t[0]["fused_over_gemm_only"] == pytest.approx(1.1)


def test_the_rows_say_what_is_ranked(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    store.add(result(medians=(105.0, 210.0), sha="f" * 64))
    store.add(result("IMPLAUSIBLE", medians=(1.0, 1.0), sha="i" * 64))  # quarantined: timings kept, not ranked
    store.add(result("INCORRECT_NUMERICS", medians=(None, None), sha="n" * 64, worst={"index": [1, 2]}))
    store.add(result(medians=(None, None), sha="c" * 64))  # passed but never timed: never ranked
    assert [r.result.kernel_sha256 for r in store.rows() if r.result.ranked] == ["f" * 64]
    (imp,) = store.rows(outcome="IMPLAUSIBLE")
    assert imp.result.timed and not imp.result.ranked and store.shape_timings(imp.id)
    (bad,) = store.rows(outcome="INCORRECT_NUMERICS")
    assert not bad.result.timed and bad.result.worst == {"index": [1, 2]}
    assert store.count() == 4


def test_a_store_of_another_schema_is_refused_in_one_line(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=1")
    with pytest.raises(StoreError, match="store schema 1"):
        ResultStore(path)


def test_rows_are_keyed_on_their_precision(tmp_path):
    store = ResultStore(tmp_path / "r.sqlite")
    bf16, fp16 = store.add(result(sha="b" * 64)), store.add(result(sha="h" * 64, dtypes=["float16", "bfloat16"]))
    assert [r.id for r in store.rows(dtype="bfloat16")] == [bf16]
    (half,) = store.rows(task="k1_gemm_rmsnorm", dtype="float16")  # keyed on the first judged, the one timed
    assert half.id == fp16 and half.result.dtype == "float16" and half.result.dtypes == ["float16", "bfloat16"]
    with store._connect() as db:
        assert dict(db.execute("SELECT id, dtype FROM evaluations")) == {bf16: "bfloat16", fp16: "float16"}


def test_a_store_from_before_fp16_opens_and_its_rows_read_as_bf16(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    eid = ResultStore(path).add(result())
    # back to schema 2 as it was: no precision column, Results that say nothing of a precision
    with sqlite3.connect(path) as db:
        old = json.loads(db.execute("SELECT result FROM evaluations").fetchone()[0])
        old.pop("dtypes"), old.pop("dtype")
        for s in old["per_shape"]:
            s.pop("dtype")
        db.execute("UPDATE evaluations SET result = ?", (json.dumps(old),))
        db.execute("DROP INDEX evaluations_task_dtype")
        db.execute("ALTER TABLE evaluations DROP COLUMN dtype")
        db.execute("DROP INDEX evaluations_eval_key")
        db.execute("ALTER TABLE evaluations DROP COLUMN eval_key")
        db.execute("PRAGMA user_version=2")
    store = ResultStore(path)
    (row,) = store.rows(dtype="bfloat16")
    assert row.id == eid and row.result == result().model_copy(update={"started_at": row.result.started_at})
    assert row.result.dtypes == ["bfloat16"] and {s.dtype for s in row.result.per_shape} == {"bfloat16"}
    assert store.rows(dtype="float16") == [] and len(store.shape_timings(eid)) == 2
    store.add(result(dtypes=["float16"]))
    assert [r.result.dtype for r in store.rows()] == ["float16", "bfloat16"]
    with store._connect() as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 4


def test_a_store_of_schema_3_gains_the_evaluation_key_and_keeps_a_key_unique(tmp_path):
    import sqlite3

    path = tmp_path / "s3.sqlite"
    eid = ResultStore(path).add(result())
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX evaluations_eval_key")
        db.execute("ALTER TABLE evaluations DROP COLUMN eval_key")
        db.execute("PRAGMA user_version=3")
    store = ResultStore(path)
    assert [r.id for r in store.rows()] == [eid]
    first = store.add(result(), key="run/k1/expert")
    assert store.add(result(kernel="other.py"), key="run/k1/expert") == first  # stored once, the first kept
    assert store.add(result(), key="run/k1/again") != first and store.add(result()) not in (first, eid)
    assert [r.result.kernel for r in store.rows()].count("other.py") == 0 and len(store.rows()) == 4
    with store._connect() as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 4
        assert sorted(k for (k,) in db.execute("SELECT eval_key FROM evaluations") if k) == ["run/k1/again", "run/k1/expert"]


def test_path_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EPIFORGE_RESULTS", str(tmp_path / "env.sqlite"))
    ResultStore().add(result())
    assert (tmp_path / "env.sqlite").is_file()


def test_unusable_path_is_one_line(tmp_path):
    (tmp_path / "dir.sqlite").mkdir()
    with pytest.raises(StoreError) as e:
        ResultStore(tmp_path / "dir.sqlite")
    assert "\n" not in str(e.value) and "dir.sqlite" in str(e.value)


# many writer processes at once
WRITER = """
import json, sys
from epiforge.eval.store import ResultStore
template = json.load(open(sys.argv[4]))
store = ResultStore(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.add({**template, "kernel_sha256": f"{sys.argv[2]}-{i}"})
"""


@pytest.mark.spawns
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
    assert len({r.result.kernel_sha256 for r in rows}) == n_proc * n_each and len({r.id for r in rows}) == len(rows)
    with store._connect() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM shape_timings").fetchone()[0] == 2 * n_proc * n_each
