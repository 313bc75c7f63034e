"""The judge's timed lead (eval/timing.py Lead): what the GPU does before each synchronized
timed call, chosen by EPIFORGE_TIMED_LEAD; a bad value is one line from the CLI; and
lab/bench/lead_study.py, which sets compare under each lead beside lab/bench/."""

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


@pytest.mark.spawns
def test_a_bad_lead_in_the_environment_is_one_line_from_the_cli(tmp_path):
    env = {**os.environ, "EPIFORGE_TIMED_LEAD": "heat:lots", "EPIFORGE_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "epiforge", "tasks", "list"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "EPIFORGE_TIMED_LEAD" in lines[0] and "heat:lots" in lines[0]


@pytest.mark.spawns
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
    from lab.bench import lead_study
    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import ResultStore

    shipped = next(r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert")
    bench_raw = json.loads((REPO / "lab" / "results" / "h200" / "agree-3-bench.json").read_text())
    theirs = {(r["task"], r["shape"]): r["fused_over_gemm_only"] for r in bench_raw["rows"] if r["task"] == shipped.task}
    ours = {s.shape: s.timing.fused_over_gemm_only.median for s in shipped.per_shape if s.timing}
    assert set(ours) == {shape for _, shape in theirs}
    slower = shipped.model_copy(deep=True)
    for s in slower.per_shape:
        if s.shape == "7B":
            s.timing.fused_over_gemm_only.median *= 1.05
    spun = shipped.model_copy(deep=True)
    spun.environment["timed_lead"] = Lead.parse("spin").describe()  # the shipped Result was timed under heat:3
    ResultStore(tmp_path / "spin.sqlite").add(spun)
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


def test_repeated_compare_runs_are_held_to_the_larger_run_to_run_change(tmp_path, capsys):
    """Two heat:3 runs, both 5% (and 5.5%) slower at 7B than the shipped k8 Result, against
    bench runs that differ by 2% at 1B: the noise bound is 2%, and 7B lies beyond it."""
    from lab.bench import lead_study
    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import ResultStore

    shipped = next(r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert")
    bench_raw = json.loads((REPO / "lab" / "results" / "h200" / "agree-3-bench.json").read_text())
    theirs = {r["shape"]: r["fused_over_gemm_only"] for r in bench_raw["rows"] if r["task"] == shipped.task}
    ours = {s.shape: s.timing.fused_over_gemm_only.median for s in shipped.per_shape if s.timing}
    stores = []
    for i, factor in enumerate((1.05, 1.055)):
        run = shipped.model_copy(deep=True)
        for s in run.per_shape:
            if s.shape == "7B":
                s.timing.fused_over_gemm_only.median *= factor
        ResultStore(tmp_path / f"run{i}.sqlite").add(run)
        stores.append(f"heat:3={tmp_path / f'run{i}.sqlite'}")
    moved = json.loads(json.dumps(bench_raw))
    next(r for r in moved["rows"] if r["task"] == shipped.task and r["shape"] == "1B")["fused_over_gemm_only"] *= 1.02
    (tmp_path / "b1.json").write_text(json.dumps(bench_raw))
    (tmp_path / "b2.json").write_text(json.dumps(moved))
    out = tmp_path / "study.md"
    assert lead_study.main(["--lead", *stores, "--bench", str(tmp_path / "b1.json"), str(tmp_path / "b2.json"),
                            "--commit", "abc", "--command", "test", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## lead heat:3, run 1 of 2" in text and "## lead heat:3, run 2 of 2" in text
    assert "## compare under lead heat:3 against itself" in text
    section = text.split("within the noise?")[1]
    assert "compare's largest run-to-run change: 0.5%; bench's: 2.0%; the bound: 2.0%." in section
    mean = {s: (ours[s] * (1.05 * 1.055) ** 0.5 if s == "7B" else ours[s])
            / (theirs[s] * (1.02 ** 0.5 if s == "1B" else 1)) for s in ours}
    beyond = sorted(s for s in ours if abs(mean[s] - 1) > 0.02)
    assert "7B" in beyond
    assert f"largest |mean compare / mean bench - 1| over 3 rows: {max(abs(m - 1) for m in mean.values()):.1%}" in section
    assert f"{len(beyond)} row(s) beyond the bound" in section
    assert f"The median mean compare / mean bench: {sorted(mean.values())[1]:.3f}." in section
    assert "outside the noise" in capsys.readouterr().out


def test_the_lead_study_refuses_a_store_named_for_another_lead(tmp_path, capsys):
    """The shipped k8 Result was timed under heat:3: named heat:10, its store is refused in
    one line that says which lead it was timed under."""
    from lab.bench import lead_study
    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import ResultStore

    shipped = next(r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert")
    assert shipped.environment["timed_lead"] == Lead.parse("heat:3").describe()
    ResultStore(tmp_path / "s.sqlite").add(shipped)
    bench = REPO / "lab" / "results" / "h200" / "agree-3-bench.json"
    args = ["--bench", str(bench), "--commit", "c", "--command", "x", "--out", str(tmp_path / "o.md")]
    assert lead_study.main(["--lead", f"heat:10={tmp_path / 's.sqlite'}", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "s.sqlite was timed under 3 ms" in err and "not under heat:10" in err
    assert lead_study.main(["--lead", f"heat:3={tmp_path / 's.sqlite'}", *args]) == 0


def test_a_lead_labelled_with_repetitions_must_have_been_timed_with_that_many(tmp_path, capsys):
    """heat:3@N names compare runs timed with N repetitions per shape: the shipped k8 Result's
    own count is accepted, any other count and a malformed N are one line each, and heat:3
    and heat:3@N are two separate sets of runs in the report."""
    from lab.bench import lead_study
    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import ResultStore

    shipped = next(r for r in lb.load_shipped() if r.task == "k8_gemm_swiglu" and r.track == "expert")
    counts = {s.timing.kernel.n for s in shipped.per_shape if s.timing}
    assert len(counts) == 1
    n = counts.pop()
    ResultStore(tmp_path / "s.sqlite").add(shipped)
    bench = REPO / "lab" / "results" / "h200" / "agree-3-bench.json"
    out = tmp_path / "o.md"
    args = ["--bench", str(bench), "--commit", "c", "--command", "x", "--out", str(out)]
    assert lead_study.main(["--lead", f"heat:3@{n + 60}={tmp_path / 's.sqlite'}", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"timed with {n} repetitions per shape, not {n + 60}" in err
    for bad in ("heat:3@", "heat:3@0", "heat:3@many"):
        assert lead_study.main(["--lead", f"{bad}={tmp_path / 's.sqlite'}", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "LEAD@N" in err and "Traceback" not in err
    assert lead_study.main(["--lead", f"heat:3={tmp_path / 's.sqlite'}", f"heat:3@{n}={tmp_path / 's.sqlite'}",
                            *args]) == 0
    text = out.read_text()
    assert "## lead heat:3: largest disagreement" in text and f"## lead heat:3@{n}: largest disagreement" in text


def test_the_lead_study_refuses_a_store_that_is_not_there(tmp_path, capsys):
    from lab.bench import lead_study

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
    from lab.bench import lead_study

    store = tmp_path / "s.jsonl"
    store.write_text("")
    (tmp_path / "b.json").write_text('{"not": "a bench file"}')
    assert lead_study.main(["--lead", f"spin={store}", "--bench", str(tmp_path / "b.json"),
                            "--commit", "c", "--command", "x", "--out", str(tmp_path / "o.md")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b.json" in err and "Traceback" not in err
