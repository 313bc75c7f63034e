"""The judge's timed lead (eval/timing.py Lead): what the GPU does before each synchronized
timed call, chosen by EPIFORGE_TIMED_LEAD; a bad value is one line from the CLI; and
bench/lead_study.py, which sets compare under each lead beside bench/."""

import json
import os
import subprocess
import sys

import pytest

from epiforge.eval.machine import REPO
from epiforge.eval.timing import DEFAULT_LEAD, Lead


def test_a_lead_is_spin_or_heat_for_some_milliseconds():
    assert Lead.parse("spin") == Lead("spin")
    assert Lead.parse("heat:3") == Lead("heat", 3.0) and Lead.parse(" heat:0.5 ").ms == 0.5
    assert Lead.parse(DEFAULT_LEAD).kind in ("spin", "heat")
    for bad in ("", "heat", "heat:", "heat:x", "heat:0.1", "heat:1000", "spin:3", "warm:3"):
        with pytest.raises(ValueError, match="EPIFORGE_TIMED_LEAD"):
            Lead.parse(bad)


def test_each_lead_says_what_the_gpu_does():
    assert "sleep" in Lead("spin").describe()
    assert "7 ms" in Lead("heat", 7.0).describe() and "GEMM" in Lead("heat", 7.0).describe()


def test_a_bad_lead_in_the_environment_is_one_line_from_the_cli(tmp_path):
    env = {**os.environ, "EPIFORGE_TIMED_LEAD": "heat:lots", "EPIFORGE_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "epiforge", "tasks", "list"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "EPIFORGE_TIMED_LEAD" in lines[0] and "heat:lots" in lines[0]


def test_the_lead_is_read_once_when_the_timer_loads():
    """A child whose environment names a lead gets that lead (the judge and its runners
    inherit it), and the default otherwise."""
    code = "from epiforge.eval.timing import LEAD; print(LEAD.kind, LEAD.ms)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EPIFORGE_TIMED_LEAD", None)
    default = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    chosen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**env, "EPIFORGE_TIMED_LEAD": "heat:12"})
    want = Lead.parse(DEFAULT_LEAD)
    assert default.stdout.split() == [want.kind, str(want.ms)]
    assert chosen.stdout.split() == ["heat", "12.0"]


def test_the_lead_study_holds_compare_against_the_first_bench_run(tmp_path):
    """Two leads' stores (the shipped k8 expert Result, its fused / GEMM-only at 7B made 5%
    slower in the second) against a bench file and a copy of it that moved one row by 2%."""
    from epiforge.bench import lead_study
    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import ResultStore

    shipped = next(r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert")
    bench_raw = json.loads((REPO / "bench" / "results" / "h200" / "agree-3-bench.json").read_text())
    theirs = {(r["task"], r["shape"]): r["fused_over_gemm_only"] for r in bench_raw["rows"] if r["task"] == shipped.task}
    ours = {s.shape: s.timing.fused_over_gemm_only.median for s in shipped.per_shape if s.timing}
    assert set(ours) == {shape for _, shape in theirs}
    slower = shipped.model_copy(deep=True)
    for s in slower.per_shape:
        if s.shape == "7B":
            s.timing.fused_over_gemm_only.median *= 1.05
    ResultStore(tmp_path / "spin.sqlite").add(shipped)
    ResultStore(tmp_path / "heat.sqlite").add(slower)
    moved = json.loads(json.dumps(bench_raw))
    row = next(r for r in moved["rows"] if r["task"] == shipped.task and r["shape"] == "1B")
    row["fused_over_gemm_only"] *= 1.02
    (tmp_path / "b1.json").write_text(json.dumps(bench_raw))
    (tmp_path / "b2.json").write_text(json.dumps(moved))
    out = tmp_path / "study.md"
    assert lead_study.main(["--lead", f"spin={tmp_path / 'spin.sqlite'}", f"heat:3={tmp_path / 'heat.sqlite'}",
                            "--bench", str(tmp_path / "b1.json"), str(tmp_path / "b2.json"),
                            "--commit", "abc", "--command", "test", "--out", str(out)]) == 0
    text = out.read_text()
    spin = max(abs(ours[s] / theirs[(shipped.task, s)] - 1) for s in ours)
    heat = max(abs(ours[s] * (1.05 if s == "7B" else 1) / theirs[(shipped.task, s)] - 1) for s in ours)
    assert f"## lead spin: largest disagreement {spin:.1%}" in text
    assert f"## lead heat:3: largest disagreement {heat:.1%}" in text
    assert "| k8_gemm_swiglu | 1B |" in text.split("## bench against itself")[1] and "| 1.020 |" in text


def test_the_lead_study_refuses_a_store_that_is_not_there(tmp_path, capsys):
    from epiforge.bench import lead_study

    assert lead_study.main(["--lead", f"spin={tmp_path / 'nope.sqlite'}", "--bench", str(tmp_path / "b.json"),
                            "--commit", "c", "--command", "x", "--out", str(tmp_path / "o.md")]) == 2
    assert "LEAD=STORE" in capsys.readouterr().err


@pytest.mark.gpu
def test_heating_keeps_the_gpu_busy_for_about_the_milliseconds_asked():
    import torch

    from epiforge.eval.timing import heat

    heat(1.0)  # the first call measures the GEMM
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = heat(8.0)
    end.record()
    torch.cuda.synchronize()
    assert n >= 4 and 4.0 < start.elapsed_time(end) < 16.0


def test_the_lead_study_says_in_one_line_that_a_bench_file_is_not_one(tmp_path, capsys):
    from epiforge.bench import lead_study

    store = tmp_path / "s.jsonl"
    store.write_text("")
    (tmp_path / "b.json").write_text('{"not": "a bench file"}')
    assert lead_study.main(["--lead", f"spin={store}", "--bench", str(tmp_path / "b.json"),
                            "--commit", "c", "--command", "x", "--out", str(tmp_path / "o.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b.json" in err and "Traceback" not in err
