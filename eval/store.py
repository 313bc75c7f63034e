"""Results store: one SQLite file, a row per evaluation, safe with several writers.

    store = ResultStore()                      # $EPIFORGE_RESULTS or .epiforge/results.sqlite
    store.add(result)                          # -> row id
    store.rows(task="k1_gemm_rmsnorm")         # dicts, newest first
    store.leaderboard("k1_gemm_rmsnorm")       # ranked (PASSED and timed) rows, fastest first

Tables: `evaluations` (task, kernel hash, track, backend/model when generated, shapes,
outcome, stage, message, errors, worst element, environment fingerprint, the whole Result
as JSON, summary speed columns) and `shape_timings` (per shape: median, IQR and n of the
kernel, the GEMM-only baseline, fused / GEMM-only, the fraction of GEMM-only time, the
speedup against each baseline, the roofline floor). IMPLAUSIBLE results keep their timings
(quarantined) but are never `ranked`.

Concurrency: WAL journal (readers never block the writer), a busy timeout, and each add()
one short BEGIN IMMEDIATE transaction, so writers queue instead of failing. This module
does not import torch: a reader needs only the standard library and pydantic.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PATH = REPO / ".epiforge" / "results.sqlite"  # git-ignored
ENV_PATH = "EPIFORGE_RESULTS"
BUSY_TIMEOUT_MS = 30_000
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    recorded_at TEXT NOT NULL,
    started_at TEXT,
    task TEXT NOT NULL,
    kernel TEXT NOT NULL,
    kernel_sha256 TEXT NOT NULL,
    track TEXT NOT NULL,
    author TEXT,
    backend TEXT,
    model TEXT,
    session TEXT,
    device TEXT NOT NULL,
    shapes TEXT NOT NULL,
    outcome TEXT NOT NULL,
    stage TEXT,
    message TEXT,
    stderr_tail TEXT,
    violations TEXT,
    worst TEXT,
    timed INTEGER NOT NULL,
    ranked INTEGER NOT NULL,
    worst_fused_over_gemm_only REAL,
    median_speedup_vs_gemm_only REAL,
    wall_s REAL,
    environment TEXT,
    result TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evaluations_task ON evaluations (task, outcome);
CREATE INDEX IF NOT EXISTS evaluations_kernel ON evaluations (kernel_sha256);
CREATE TABLE IF NOT EXISTS shape_timings (
    evaluation_id INTEGER NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE,
    shape TEXT NOT NULL,
    median_us REAL NOT NULL,
    iqr_us REAL NOT NULL,
    n INTEGER NOT NULL,
    gemm_only_median_us REAL,
    fused_over_gemm_only REAL,
    gemm_fraction REAL,
    speedups TEXT,
    floor_us REAL,
    PRIMARY KEY (evaluation_id, shape)
);
"""


class StoreError(RuntimeError):
    """The store file cannot be used (one line)."""


class ResultStore:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path or os.environ.get(ENV_PATH) or DEFAULT_PATH)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"{self.path}: cannot open the results store: {e}") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA foreign_keys=ON")
        db.row_factory = sqlite3.Row
        return db

    # ---- writing -----------------------------------------------------------------------

    def add(self, result) -> int:
        """Record one eval.Result (or its JSON dict); returns the new row's id."""
        r = result if isinstance(result, dict) else result.model_dump(mode="json")
        timings = [(s["shape"], s["timing"]) for s in r.get("per_shape", []) if s.get("timing")]
        ratios = [t.get("fused_over_gemm_only") for _, t in timings if t.get("fused_over_gemm_only")]
        speedups = sorted(t["speedup"]["gemm_only"] for _, t in timings if t.get("speedup", {}).get("gemm_only"))
        timed = bool(timings)
        row = {
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "started_at": r.get("started_at"), "task": r["task"], "kernel": r["kernel"],
            "kernel_sha256": r["kernel_sha256"], "track": r["track"], "author": r.get("author"),
            "backend": r.get("backend"), "model": r.get("model"), "session": r.get("session"),
            "device": r["device"], "shapes": r["shapes"], "outcome": r["outcome"], "stage": r.get("stage"),
            "message": r.get("message"), "stderr_tail": r.get("stderr_tail"),
            "violations": json.dumps(r.get("violations", [])), "worst": json.dumps(r.get("worst")),
            "timed": int(timed), "ranked": int(timed and r["outcome"] == "PASSED"),
            "worst_fused_over_gemm_only": max(ratios) if ratios else None,
            "median_speedup_vs_gemm_only": speedups[len(speedups) // 2] if speedups else None,
            "wall_s": r.get("wall_s"), "environment": json.dumps(r.get("environment", {}), sort_keys=True),
            "result": json.dumps(r),
        }
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # take the write lock now: writers queue, never deadlock
            cur = db.execute(f"INSERT INTO evaluations ({cols}) VALUES ({marks})", row)
            eid = cur.lastrowid
            for shape, t in timings:
                k = t["kernel"]
                db.execute(
                    "INSERT INTO shape_timings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (eid, shape, k["median_us"], k["q3_us"] - k["q1_us"], k["n"],
                     (t.get("gemm_only") or {}).get("median_us"), t.get("fused_over_gemm_only"),
                     t.get("gemm_fraction"), json.dumps(t.get("speedup", {})), (t.get("roofline") or {}).get("floor_us")),
                )
            db.execute("COMMIT")
            return eid
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    # ---- reading -----------------------------------------------------------------------

    def rows(self, task: str | None = None, outcome: str | None = None, limit: int | None = None) -> list[dict]:
        sql, args = "SELECT * FROM evaluations WHERE 1=1", []
        if task:
            sql, args = sql + " AND task = ?", [*args, task]
        if outcome:
            sql, args = sql + " AND outcome = ?", [*args, outcome]
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self._connect() as db:
            return [_decode(dict(r)) for r in db.execute(sql, args)]

    def shape_timings(self, evaluation_id: int) -> list[dict]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM shape_timings WHERE evaluation_id = ? ORDER BY shape", (evaluation_id,))
            return [{**dict(r), "speedups": json.loads(r["speedups"] or "{}")} for r in rows]

    def leaderboard(self, task: str, device: str = "cuda", shapes: str = "paper") -> list[dict]:
        """Ranked rows (PASSED and timed) of a task, best (lowest worst fused / GEMM-only) first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT * FROM evaluations WHERE task = ? AND device = ? AND shapes = ? AND ranked = 1 "
                "ORDER BY worst_fused_over_gemm_only ASC, id DESC", (task, device, shapes))
            return [_decode(dict(r)) for r in rows]

    def count(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]


def _decode(row: dict) -> dict:
    for key in ("violations", "worst", "environment", "result"):
        if row.get(key) is not None:
            row[key] = json.loads(row[key])
    row["timed"], row["ranked"] = bool(row["timed"]), bool(row["ranked"])
    return row
