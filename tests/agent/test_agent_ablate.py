"""Knowledge-pack ablations: a scripted model that only succeeds when a page is in its
prompt, run with and without that page; the report shows the difference."""

import json

import pytest
from loopback import Loopback, Reply, system_text
from scenarios import K1_GOOD

from epiforge import cli as epiforge
from epiforge.agent.ablate import FULL, report, run_ablation
from epiforge.agent.backends import make_backend
from epiforge.agent.pack import PackError
from epiforge.agent.session import Budget, SessionConfig


def _model(body):
    """Writes the right kernel at once if the pack told it how; otherwise it gives up."""
    if "ROW-SCALE-HINT" not in system_text(body):
        return Reply("I do not know how to do this.")
    if len(body["messages"]) == 1:
        return Reply("the hint says: scale rows by rstd", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])
    return Reply("done")


@pytest.fixture
def docs(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "index.md").write_text("# Index\n")
    (d / "hint.md").write_text("ROW-SCALE-HINT: multiply acc by the PerRow rstd.\n")
    return d


@pytest.mark.spawns
def test_ablation_runs_and_reports_each_condition(tmp_path, docs, anthropic_key, fast_retry, capsys):
    config = SessionConfig(task="k1", backend="anthropic", model="claude-haiku-4-5-loopback", compile=False,
                           device="cpu", budget=Budget(max_turns=4))
    with Loopback("anthropic", _model, model="claude-haiku-4-5-loopback") as server:
        logs = run_ablation(config, lambda: make_backend("anthropic", model=config.model, base_url=server.url,
                                                         retry=fast_retry, timeout_s=10),
                            pages=["hint"], runs=2, log_dir=tmp_path / "logs", docs_dir=docs, say=lambda _: None)
    assert len(logs) == 4
    rows = {r.without: r for r in report(logs)}
    full, ablated = rows[FULL], rows["hint"]
    assert (full.runs, full.passed, full.success_rate) == (2, 2, 1.0)
    assert (ablated.runs, ablated.passed, ablated.success_rate, ablated.delta_success) == (2, 0, 0.0, -1.0)
    assert full.mean_turns == 1 and ablated.mean_turns == 2 and ablated.delta_turns == 1
    assert full.mean_cost_usd > 0 and ablated.mean_cost_usd > 0

    # the same report from the logs alone, through the CLI; a file that is no session log among
    # them is named and left out
    (tmp_path / "logs" / "zz-notes.jsonl").write_text("not a log\n")
    rc = epiforge.main(["ablate", "--from-logs", str(tmp_path / "logs"), "--json", "--report", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert rc == 0 and printed == json.loads((tmp_path / "r.json").read_text())
    assert "zz-notes.jsonl" in err and "left out of the report" in err and err.count("\n") == 1
    assert [(r["without"], r["success_rate"]) for r in printed] == [(FULL, 1.0), ("hint", 0.0)]


def test_an_unknown_page_fails_before_any_session(tmp_path, docs):
    config = SessionConfig(task="k1", backend="anthropic", model="m")
    made = []
    with pytest.raises(PackError, match="'nope' matches no page"):
        run_ablation(config, lambda: made.append(1), pages=["nope"], runs=1, log_dir=tmp_path, docs_dir=docs)
    assert made == [] and not list(tmp_path.glob("*.jsonl"))


@pytest.mark.spawns
def test_ablate_runs_its_conditions_side_by_side_into_the_data_directory(tmp_path, docs, anthropic_key, capsys):
    """--concurrency C: the conditions' sessions run through agent/runs.py's pool, C at a time;
    with no --log-dir the logs go to the data directory's ablations/<time>/."""
    import threading

    lock, first, overlapped = threading.Condition(), [], []

    def model(body):  # both sessions' first requests wait (up to 30 s) until both are in flight
        if len(body["messages"]) == 1:
            with lock:
                first.append(1)
                lock.notify_all()
                overlapped.append(lock.wait_for(lambda: len(first) >= 2, timeout=30))
        return _model(body)

    with Loopback("anthropic", model, model="claude-haiku-4-5-loopback") as server:
        rc = epiforge.main(["ablate", "--task", "k1", "--backend", "anthropic", "--model", "claude-haiku-4-5-loopback",
                            "--base-url", server.url, "--runs", "1", "--concurrency", "2", "--pack-without", "hint",
                            "--docs-dir", str(docs), "--max-turns", "4", "--no-compile", "--device", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "at most 2 at a time" in err and "[without hint, run 1 of 1] session " in err
    assert [(r["without"], r["runs"], r["success_rate"]) for r in json.loads(out)] == [(FULL, 1, 1.0), ("hint", 1, 0.0)]
    (stamp,) = (tmp_path / "data" / "ablations").iterdir()
    assert len(list(stamp.glob("*.jsonl"))) == 2
    assert overlapped == [True, True] and len(server.requests) == 3  # the full pack's session passed at once


def test_ablate_concurrency_must_be_at_least_one(capsys):
    assert epiforge.main(["ablate", "--task", "k1", "--backend", "anthropic", "--pack-without", "hint",
                          "--concurrency", "0"]) == 2
    assert capsys.readouterr().err.strip() == "epiforge: --concurrency must be at least 1 (got 0)"


def test_a_log_dir_that_cannot_be_written_is_the_one_line_of_an_ablation(tmp_path, docs, anthropic_key, capsys):
    (tmp_path / "a-file").write_text("not a folder\n")
    bad = tmp_path / "a-file" / "x"
    assert epiforge.main(["ablate", "--task", "k1", "--backend", "anthropic", "--pack-without", "hint",
                          "--docs-dir", str(docs), "--log-dir", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert "ablation:" not in out and "Traceback" not in err
    assert err.strip().splitlines() == [f"epiforge: --log-dir {bad}: {tmp_path / 'a-file'} is not a directory"]


def test_a_report_that_cannot_be_written_is_refused_before_any_session(tmp_path, docs, anthropic_key, capsys):
    """--report is checked before the sessions run (they cost money); a missing folder is
    made when the report is written."""
    (tmp_path / "a-file").write_text("not a folder\n")
    bad = tmp_path / "a-file" / "r.json"
    assert epiforge.main(["ablate", "--task", "k1", "--backend", "anthropic", "--pack-without", "hint",
                          "--docs-dir", str(docs), "--log-dir", str(tmp_path / "logs"), "--report", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [f"epiforge: --report {bad}: {tmp_path / 'a-file'} is not a directory"]
    assert not (tmp_path / "logs").exists() and not out
    assert epiforge.main(["ablate", "--from-logs", str(tmp_path), "--report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"epiforge: --report {tmp_path}: a directory, not a file"
