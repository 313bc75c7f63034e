"""Results store: one SQLite file, a row per evaluation, safe with several writers.

    store = ResultStore()                      # $EPIFORGE_RESULTS or .epiforge/results.sqlite
    store.add(result)                          # -> row id
    store.rows(task="k1_gemm_rmsnorm")         # StoredResults (id, recorded_at, the Result), newest first

Tables: `evaluations` (task, kernel hash, track, backend/model when generated, shapes,
precision (the Result's dtype: what it was timed in, the first judged), outcome, stage, message, errors, worst element, environment fingerprint, the whole Result
as JSON, summary speed columns) and `shape_timings` (per shape: median, IQR and n of the
kernel, the GEMM-only baseline, fused / GEMM-only, the fraction of GEMM-only time, the
speedup against each baseline, the roofline floor; the timings are in the evaluation's
precision), and the evaluation's key where its writer gave one (unique: an evaluation
retried on a cluster is stored once). A store of an older schema gains the columns on
opening (schema 2's rows bfloat16, as their Results read). IMPLAUSIBLE results keep their timings
(quarantined) but are never `ranked`; the leaderboard (eval/leaderboard.py) ranks.

Concurrency: WAL journal (readers never block the writer), a busy timeout, and each add()
one short BEGIN IMMEDIATE transaction, so writers queue instead of failing. This module
reads and writes eval.result.Result, nothing else.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from pydantic import BaseModel, ValidationError

from epiforge.eval.result import Result
from epiforge.eval.machine import STATE_DIR

DEFAULT_PATH = STATE_DIR / "results.sqlite"  # git-ignored
ENV_PATH = "EPIFORGE_RESULTS"
BUSY_TIMEOUT_MS = 30_000
SCHEMA_VERSION = 4
#: what opening a store of an older schema adds to it, one version at a time (its rows keep
#: their values): 2 -> 3 the precision, 3 -> 4 the evaluation key (add(key=...))
MIGRATIONS = {2: "ALTER TABLE evaluations ADD COLUMN dtype TEXT NOT NULL DEFAULT 'bfloat16'",
              3: "ALTER TABLE evaluations ADD COLUMN eval_key TEXT"}

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
    dtype TEXT NOT NULL DEFAULT 'bfloat16',
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
    result TEXT NOT NULL,
    eval_key TEXT
);
CREATE INDEX IF NOT EXISTS evaluations_task ON evaluations (task, outcome);
CREATE INDEX IF NOT EXISTS evaluations_kernel ON evaluations (kernel_sha256);
CREATE INDEX IF NOT EXISTS evaluations_task_dtype ON evaluations (task, dtype);
CREATE UNIQUE INDEX IF NOT EXISTS evaluations_eval_key ON evaluations (eval_key);
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


class StoredResult(BaseModel):
    """One row of the store: a Result, and where and when it was recorded."""

    id: int
    recorded_at: str
    result: Result


class ResultStore:
    """read_only: for readers (the leaderboard): the file must exist and be a store; nothing
    is created, migrated or written, so a typo'd path is an error, not a new empty store."""

    def __init__(self, path: str | os.PathLike | None = None, read_only: bool = False):
        self.path = Path(path or os.environ.get(ENV_PATH) or DEFAULT_PATH)
        self.read_only = read_only
        if read_only:
            self._check_readable()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, *MIGRATIONS, SCHEMA_VERSION):
                    raise StoreError(self._foreign(version) + "; move it aside or name another file")
                db.execute("PRAGMA journal_mode=WAL")
                while version in MIGRATIONS:
                    db.execute(MIGRATIONS[version])
                    version += 1
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"{self.path}: cannot open the results store: {e}") from None

    def _check_readable(self) -> None:
        if not self.path.is_file():
            raise StoreError(f"{self.path}: no results store there" + (" (a directory)" if self.path.is_dir() else ""))
        try:
            with self._connect() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot read the results store: {e}") from None
        if "evaluations" not in tables:
            raise StoreError(f"{self.path}: not an epiforge results store")
        if version not in (*MIGRATIONS, SCHEMA_VERSION):
            raise StoreError(self._foreign(version))

    def _foreign(self, version: int) -> str:
        return f"{self.path}: written by another epiforge (store schema {version}, this one reads {SCHEMA_VERSION})"

    def _connect(self) -> sqlite3.Connection:
        # read-only: a URI opened mode=ro, so that SQLite neither creates nor writes the file
        target, uri = (f"{self.path.resolve().as_uri()}?mode=ro", True) if self.read_only else (self.path, False)
        db = sqlite3.connect(target, uri=uri, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA foreign_keys=ON")
        db.row_factory = sqlite3.Row
        return db

    # ---- writing -----------------------------------------------------------------------

    def add(self, result: Result, key: str | None = None) -> int:
        """Record one Result; returns its row's id. key: the evaluation's own key (e.g. a
        run's id and the task and kernel label): a Result added again under a key already
        stored is not added twice (a retried evaluation of a cluster run), and the first
        row's id is returned."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        if not isinstance(result, Result):
            result = Result.model_validate(result)
        timed = [(sh.shape, sh.timing) for sh in result.per_shape if sh.timing is not None]
        ratios = [t.fused_over_gemm_only.median for _, t in timed]
        row = {
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "started_at": result.started_at, "task": result.task, "kernel": result.kernel,
            "kernel_sha256": result.kernel_sha256, "track": result.track, "author": result.author,
            "backend": result.backend, "model": result.model, "session": result.session,
            "device": result.device, "shapes": result.shapes, "dtype": result.dtype, "outcome": result.outcome.value, "stage": result.stage,
            "message": result.message, "stderr_tail": result.stderr_tail,
            "violations": json.dumps(result.violations), "worst": json.dumps(result.worst),
            "timed": int(result.timed), "ranked": int(result.ranked),
            "worst_fused_over_gemm_only": max(ratios) if ratios else None,
            "median_speedup_vs_gemm_only": sorted(1 / r for r in ratios)[len(ratios) // 2] if ratios else None,
            "wall_s": result.wall_s, "environment": json.dumps(result.environment, sort_keys=True),
            "result": result.model_dump_json(), "eval_key": key,
        }
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # take the write lock now: writers queue, never deadlock
            if key is not None:
                seen = db.execute("SELECT id FROM evaluations WHERE eval_key = ?", (key,)).fetchone()
                if seen is not None:
                    db.execute("COMMIT")
                    return seen[0]
            cur = db.execute(f"INSERT INTO evaluations ({cols}) VALUES ({marks})", row)
            eid = cur.lastrowid
            for shape, t in timed:
                db.execute(
                    "INSERT INTO shape_timings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (eid, shape, t.kernel.median_us, t.kernel.q3_us - t.kernel.q1_us, t.kernel.n,
                     t.baselines["gemm_only"].median_us, t.fused_over_gemm_only.median, t.fraction_of_speed_of_light,
                     json.dumps({k: v.median for k, v in t.speedup.items()}), (t.roofline or {}).get("floor_us")),
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

    def rows(self, task: str | None = None, outcome: str | None = None, limit: int | None = None,
             dtype: str | None = None) -> list[StoredResult]:
        """The stored Results, newest first; dtype: only those keyed on that precision."""
        sql, args = "SELECT id, recorded_at, result FROM evaluations WHERE 1=1", []
        if task:
            sql, args = sql + " AND task = ?", [*args, task]
        if dtype:
            sql, args = sql + " AND dtype = ?", [*args, dtype]
        if outcome:
            sql, args = sql + " AND outcome = ?", [*args, outcome]
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        try:
            with self._connect() as db:
                found = list(db.execute(sql, args))
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot read the results store: {e}") from None
        out = []
        for r in found:
            try:
                out.append(StoredResult(id=r["id"], recorded_at=r["recorded_at"],
                                        result=Result.model_validate_json(r["result"])))
            except ValidationError:
                raise StoreError(f"{self.path}: row {r['id']} is not a Result of this version (schema "
                                 f"{SCHEMA_VERSION}); start a new store") from None
        return out

    def shape_timings(self, evaluation_id: int) -> list[dict]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM shape_timings WHERE evaluation_id = ? ORDER BY shape", (evaluation_id,))
            return [{**dict(r), "speedups": json.loads(r["speedups"] or "{}")} for r in rows]

    def count(self) -> int:
        with self._connect() as db:
            return db.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
