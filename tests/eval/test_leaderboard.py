"""eval/leaderboard.py: what is ranked and what is listed apart, fast_p, pass@k, the shipped
H200 results as a machine with no GPU reads them, and the CLI's speed."""

import hashlib
import re
import os
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epiforge import tasks
from epiforge.eval import leaderboard as lb
from epiforge.eval.result import Outcome, Result, ShapeResult, ShapeTiming
from epiforge.eval.stats import summarize
from epiforge.eval.store import ResultStore

REPO = Path(__file__).resolve().parents[2]


def timing(kernel, gemm, compile_):
    reps = (1.0, 1.01, 0.99)
    return ShapeTiming.measured({"kernel": summarize([kernel * r for r in reps], keep=True),
                                 "gemm_only": summarize([gemm * r for r in reps], keep=True),
                                 "torch_compile": summarize([compile_ * r for r in reps], keep=True)})


def result(task="k1_gemm_rmsnorm", track="expert", outcome="PASSED", device="cuda", times=((110, 100, 150),), **kw):
    shapes = [ShapeResult(shape=f"s{i}", dims={}, outcome=Outcome.PASSED, timing=timing(*t) if t else None)
              for i, t in enumerate(times)]
    path = lb.expert_kernel(task)  # an expert row as if timed with today's expert kernel
    sha = hashlib.sha256(path.read_bytes()).hexdigest() if path else "0"
    base = dict(task=task, kernel="k.py", kernel_sha256=sha, track=track, device=device, shapes="paper")
    passed = outcome == "PASSED"
    return Result.judged(base, Outcome(outcome), "done" if passed else "plausibility",
                         kw.pop("message", "passed" if passed else f"{outcome} here"), shapes, **kw)


def test_only_ranked_results_make_cells_and_the_best_stands_for_a_cell():
    slow = result(times=((150, 100, 150),))
    fast = result(times=((105, 100, 150),))
    gen = result(track="generated", backend="anthropic", model="m", times=((210, 100, 300),))
    board = lb.build([slow, fast, gen, result(outcome="IMPLAUSIBLE"), result(device="cpu", times=(None,)),
                      result(task="k2_gemm_rmsnorm_swiglu", outcome="INCORRECT_NUMERICS", times=(None,))])
    assert [(c.task, c.track) for c in board.cells] == [("k1_gemm_rmsnorm", "expert"),
                                                         ("k1_gemm_rmsnorm", "generated:anthropic/m")]
    assert board.cell("k1_gemm_rmsnorm", "expert").result is fast
    assert sorted(why.split(":")[0] for why, _ in board.apart) == ["provisional", "quarantined"]
    assert board.unsolved == {("k2_gemm_rmsnorm_swiglu", "expert", "bfloat16", "unnamed GPU"): "INCORRECT_NUMERICS"}
    text = lb.render_markdown(board)
    assert "| k1 | expert | yes | 0.95 |" in text and "| k2 | expert | no (INCORRECT_NUMERICS) |" in text
    assert "2.000 (each run's speed of light)" in text  # generated / expert: 2.10 / 1.05
    assert "## Not ranked" in text and "provisional" in text


def test_each_gpu_is_ranked_apart_and_generated_meets_the_expert_of_its_own_gpu():
    """Results of two GPU models never share a cell, a table or a ratio: the H200's faster
    expert does not stand for the H100's, and the H100's generated kernel is set beside the
    H100's expert."""
    h200, h100 = {"gpu": "NVIDIA H200"}, {"gpu": "NVIDIA H100 80GB HBM3"}
    e200 = result(times=((105, 100, 150),), environment=h200)
    e100 = result(times=((125, 100, 150),), environment=h100)
    g100 = result(track="generated", backend="command", model="m", times=((250, 100, 300),), environment=h100)
    bad = result(task="k2_gemm_rmsnorm_swiglu", outcome="INCORRECT_NUMERICS", times=(None,), environment=h200)
    board = lb.build([e200, e100, g100, bad])
    assert board.gpus() == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert board.cell("k1_gemm_rmsnorm", "expert", gpu="NVIDIA H200").result is e200
    assert board.cell("k1_gemm_rmsnorm", "expert", gpu="NVIDIA H100 80GB HBM3").result is e100
    assert board.cell("k1_gemm_rmsnorm", "generated:command/m", gpu="NVIDIA H200") is None
    assert board.fast_p("expert", "torch_compile", 1.3, gpu="NVIDIA H200") == (1, 1)  # 150 / 105
    assert board.fast_p("expert", "torch_compile", 1.3, gpu="NVIDIA H100 80GB HBM3") == (0, 1)  # 150 / 125
    text = lb.render_markdown(board)
    h100_table, h200_table = text.split("## Tasks x tracks in bfloat16 on ")[1:3]
    assert h100_table.startswith("NVIDIA H100 80GB HBM3") and h200_table.startswith("NVIDIA H200")
    assert "| k1 | expert | yes | 0.80 |" in h100_table and "| k1 | expert | yes | 0.95 |" in h200_table
    assert "2.000 (each run's speed of light)" in h100_table  # 2.50 / 1.25, not 2.50 / 1.05
    assert "| k1 | generated" not in h200_table and "| k2 | expert | no (INCORRECT_NUMERICS) |" in h200_table
    assert "k2" not in h100_table.split("fast_p")[0].split("Not timed here yet")[0]


def test_each_precision_is_ranked_apart_and_generated_meets_the_expert_of_its_own():
    bf16 = result(times=((105, 100, 150),))
    fp16 = result(dtypes=["float16"], times=((120, 100, 150),))  # slower: still its precision's cell
    gen = result(track="generated", backend="anthropic", model="m", dtypes=["float16"], times=((240, 100, 300),))
    board = lb.build([bf16, fp16, gen])
    assert board.dtypes() == ["bfloat16", "float16"]
    assert board.cell("k1_gemm_rmsnorm", "expert").result is bf16
    assert board.cell("k1_gemm_rmsnorm", "expert", "float16").result is fp16
    assert board.cell("k1_gemm_rmsnorm", "generated:anthropic/m") is None
    assert board.fast_p("expert", "torch_compile", 1.2) == (1, 1)  # bf16: 150 / 105
    assert board.fast_p("expert", "torch_compile", 1.2, "float16") == (1, 1)  # 150 / 120
    assert board.fast_p("generated:anthropic/m", "torch_compile", 1.0, "float16") == (1, 1)  # 300 / 240
    text = lb.render_markdown(board)
    first, second = text.split("## Tasks x tracks in float16")
    assert "## Tasks x tracks in bfloat16" in first and "| k1 | expert | yes | 0.95 |" in first
    assert "generated:anthropic/m | yes" not in first
    assert "| k1 | expert | yes | 0.83 |" in second
    assert "2.000 (each run's speed of light)" in second  # 2.40 / 1.20: fp16's expert, not bf16's (2.286)


def test_fast_p_counts_shapes_and_states_the_denominator():
    board = lb.build([result(times=((100, 100, 130), (100, 100, 110), (100, 100, 160)))])
    assert [board.fast_p("expert", "torch_compile", p) for p in lb.FAST_P] == [(3, 3), (2, 3), (1, 3)]
    assert "| expert | torch_compile | 3/3 | 2/3 | 1/3 |" in lb.render_markdown(board)
    c = board.cells[0]
    assert c.speedup_geomean("torch_compile") == pytest.approx((1.3 * 1.1 * 1.6) ** (1 / 3))


@pytest.mark.parametrize("n,c,k,want", [(5, 2, 1, 0.4), (5, 2, 5, 1.0), (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
                                        (4, 0, 1, 0.0), (3, 1, 5, None)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, want):
    got = lb.pass_at_k(n, c, k)
    assert got == want if want is None else got == pytest.approx(want)


def test_agent_sessions_give_pass_at_k_and_costs():
    rows = lb.agent_rows([REPO / "logs" / "examples"])
    (row,) = rows
    assert row.backend == "anthropic" and row.tasks == {"k8_gemm_swiglu": (1, 1)} and row.solved == 1
    assert row.pass_at(1) == 1.0 and row.pass_at(5) is None and row.turns > 0 and row.first_correct_s[0] > 0


def test_the_shipped_results_are_compares_of_every_task():
    """eval/data/h200-compare*.jsonl: `epiforge compare --shapes paper` of every task with an
    expert kernel, on the H200, by the judge (not imported from bench), FlashInfer timed where
    it has the op, no machine path; each file one run of the judge at one commit, on one GPU.
    eval/data/h100-compare.jsonl: the same on the H100, of every task but k7 (out of the
    judge's memory at 70B there) and the layer."""
    from epiforge.eval.flashinfer import ROPE_TASKS
    from epiforge.eval.timing import DEFAULT_LEAD, Lead

    everything = lb.load_shipped()
    shipped = [r for r in everything if r.environment["gpu"] == "NVIDIA H200"]
    experts = [r.task for r in shipped if r.track == "expert"]
    have_expert = {t.name for t in tasks.load_catalogue()[0] if lb.expert_kernel(t.name) is not None}
    assert sorted(experts) == sorted(have_expert), "each task with an expert kernel once, in one of the files"
    on_h100 = lb.load_shipped_file(lb.SHIPPED_H100)
    assert {r.environment["gpu"] for r in on_h100} == {"NVIDIA H100 80GB HBM3"} and all(r.ranked for r in on_h100)
    assert sorted(r.task for r in on_h100 if r.track == "expert") == sorted(
        have_expert - {"k7_gemm_partial_swiglu_bwd", "layer_non_attention_fwd_bwd"})
    # with every task timed on the H200, its table names none as missing; the H100's names those two
    lines = lb.render_markdown(lb.build(everything)).splitlines()
    assert [x.split(" (")[0] for x in lines if x.startswith("Not timed here yet:")] == ["Not timed here yet: k7, layer"]
    # and without one file's tasks, it names exactly those
    from epiforge.tasks import id_of

    later = {r.task for r in lb.load_shipped_file(lb.SHIPPED_LATER[0])}
    first = lb.load_shipped_file(lb.SHIPPED)
    (line,) = [x for x in lb.render_markdown(lb.build(first)).splitlines() if x.startswith("Not timed here yet:")]
    assert sorted(line.split(": ", 1)[1].split(" (")[0].split(", ")) == sorted(id_of(t) for t in later)
    fi_tasks = {"k0_gemm_residual_partial_rmsnorm", "k1_gemm_rmsnorm", "k2_gemm_rmsnorm_swiglu", "k8_gemm_swiglu",
                *ROPE_TASKS}
    for r in shipped:
        assert r.ranked and r.environment["gpu"] == "NVIDIA H200" and r.environment["commit"]
        assert not Path(r.kernel).is_absolute() and (REPO / r.kernel).is_file()
        assert not re.search(r"(?<![\w.<>-])/(?:work|root|tmp|opt|home|usr|mnt|var)/", r.model_dump_json()), r.task
        shown = [s for s in r.per_shape if not s.hidden]
        assert [s.shape for s in shown] == ["1B", "7B", "70B"]
        for s in shown:
            assert s.timing.source == "eval" and s.timing.speedup["gemm_only"].median == pytest.approx(
                1 / s.timing.fused_over_gemm_only.median, rel=0.05)  # two medians of reciprocal per-rep ratios
            assert ("flashinfer" in s.timing.speedup) == (r.task in fi_tasks), (r.task, s.timing.notes.get("flashinfer"))
    # generated kernels: real LLM sessions only (the scripted k8 replay is out), each timed beside its expert
    generated = [r for r in everything if r.track == "generated"]
    assert sorted(tasks.id_of(r.task) for r in generated) == ["k5", "k6", "k9", "qkn"]
    assert all(r.backend == "command" and "scripted" not in r.model for r in generated)
    assert all("kernel:expert" in s.timing.speedup for r in generated for s in r.per_shape if s.timing)
    # each file: one run of the judge as it stood (one commit), the default timed lead (eval/timing.py)
    assert lb.SHIPPED_FILES[0] == lb.SHIPPED and all(p.is_file() for p in lb.SHIPPED_FILES)
    for path in lb.SHIPPED_FILES:
        rs = lb.load_shipped_file(path)
        assert rs and len({r.environment["commit"] for r in rs}) == 1, path
        assert {r.environment.get("timed_lead") for r in rs} == {Lead.parse(DEFAULT_LEAD).describe()}, path
    # the leaderboard names each file as a source of its own
    lines = lb.describe_shipped()
    assert len(lines) == len(lb.SHIPPED_FILES) and all(("NVIDIA H200" in x) != ("NVIDIA H100" in x) and "commit " in x
                                                        for x in lines)


@pytest.mark.spawns
def test_the_cli_shows_the_h200_numbers_on_a_cpu_in_under_5_s(tmp_path):
    ResultStore(tmp_path / "none.sqlite")  # an empty store of one's own
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--store", str(tmp_path / "none.sqlite")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    k7 = next(r for r in lb.load_shipped() if r.task == "k7_gemm_partial_swiglu_bwd" and r.track == "expert")
    sol = " / ".join(f"{1 / s.timing.fused_over_gemm_only.median:.2f}" for s in k7.per_shape if s.timing and not s.hidden)
    # "earlier version" where the expert file changed since it was timed (its sha256)
    from epiforge.eval.machine import expert_kernel

    current = hashlib.sha256(expert_kernel(k7.task).read_bytes()).hexdigest() == k7.kernel_sha256
    track = "expert" if current else "expert (earlier version)"
    assert "NVIDIA H200" in out.stdout and f"| k7 | {track} | yes | {sol} |" in out.stdout
    assert took < 5, f"{took:.1f} s"
    bad = subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--logs", str(tmp_path / "nope")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a directory" in bad.stderr


def _board_with_everything(tmp_path):
    from epiforge.eval.leaderboard import AgentRow

    expert = [result(task=t, times=((110, 100, 150), (105, 100, 140))) for t in ("k1_gemm_rmsnorm", "k8_gemm_swiglu")]
    gen = [result(task=t, track="generated", backend="anthropic", model="m", times=((130, 100, 150), (120, 100, 140)))
           for t in ("k1_gemm_rmsnorm", "k8_gemm_swiglu")]
    agents = [AgentRow(backend="anthropic", model="m", tasks={"k1_gemm_rmsnorm": (4, 3)}, solved=3, turns=30,
                       tokens=9000, usd=1.5, first_correct_s=[60.0])]
    return lb.build(expert + gen, agents, ["synthetic results"])


def test_the_html_page_embeds_three_plots_and_the_tables(tmp_path):
    from epiforge.eval.leaderboard_html import write_html

    page = tmp_path / "board.html"
    write_html(_board_with_everything(tmp_path), page)
    text = page.read_text()
    assert text.count("<img class='plot'") == 3 and "data:image/png;base64," in text
    assert "<table>" in text and "generated:anthropic/m" in text and "fast_p" in text
    empty = tmp_path / "empty.html"
    write_html(lb.build([]), empty)
    assert empty.read_text().count("Nothing to plot yet") == 3


@pytest.mark.spawns
def test_the_html_page_renders_in_headless_chromium(tmp_path):
    import shutil

    from matplotlib import image

    from epiforge.eval.leaderboard_html import write_html

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium on this machine (.ci/run installs Debian's)")
    page, shot = tmp_path / "board.html", tmp_path / "board.png"
    write_html(_board_with_everything(tmp_path), page)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,2400", page.as_uri()], capture_output=True, timeout=120)
    pixels = image.imread(str(shot))[..., :3]
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    not_white = (pixels < 0.95).any(axis=-1).mean()
    assert not_white > 0.05, f"the page looks blank ({not_white:.3f} of it is not white)"
    # matplotlib's first colours (tab:blue, tab:orange) fill the bars and dots of the plots
    blue = (abs(pixels - [31 / 255, 119 / 255, 180 / 255]).max(axis=-1) < 0.06).sum()
    orange = (abs(pixels - [255 / 255, 127 / 255, 14 / 255]).max(axis=-1) < 0.06).sum()
    assert blue > 2000 and orange > 500, (blue, orange)


def test_an_expert_row_timed_with_an_older_kernel_is_labelled_and_the_authors_are_named():
    shipped = {r.task: r for r in lb.load_shipped()}
    k1 = shipped["k1_gemm_rmsnorm"]
    assert lb.expert_is_current(k1)  # the file's sha256 is the one the shipped row was timed with
    text = lb.render_markdown(lb.build([k1]))
    assert "| k1 | expert | yes |" in text and "earlier version" not in text
    older = k1.model_copy(update={"kernel_sha256": "0" * 64})
    text = lb.render_markdown(lb.build([older]))
    assert "| k1 | expert (earlier version) | yes |" in text and "k1 were timed with an earlier version" in text
    assert lb.expert_author("k1_gemm_rmsnorm") == "epiforge maintainers"
    assert lb.expert_author("k8_gemm_swiglu").startswith("quack library")
    text = lb.render_markdown(lb.build([shipped["k8_gemm_swiglu"], k1]))
    assert "quack's library epilogues: k8;" in text
    assert "k3hf and k4hf keep quack's" in text and "ZdZ as a sum" in text


def test_generated_over_expert_is_the_one_runs_ratio_where_compare_timed_both():
    shipped = lb.load_shipped_file(lb.SHIPPED_H100)
    (gen,) = [r for r in shipped if r.track == "generated" and r.task == "k9_gemm_partial_cross_entropy"]
    ratios = [1 / s.timing.speedup["kernel:expert"].median for s in gen.per_shape if s.timing]
    want = math.exp(sum(map(math.log, ratios)) / len(ratios))
    row = next(line for line in lb.render_markdown(lb.build(shipped)).splitlines() if line.startswith("| k9 | generated"))
    assert row.endswith(f"| {want:.3f} (one run, geomean) |")
    # without the expert timed beside it, the cross-run figure, labelled as such
    alone = gen.model_copy(update={"per_shape": [s.model_copy(update={"timing": s.timing.model_copy(update={
        "speedup": {k: v for k, v in s.timing.speedup.items() if k != "kernel:expert"}})}) if s.timing else s
        for s in gen.per_shape]})
    expert = next(r for r in shipped if r.task == gen.task and r.track == "expert")
    row = next(line for line in lb.render_markdown(lb.build([expert, alone])).splitlines()
               if line.startswith("| k9 | generated"))
    assert row.endswith("(each run's speed of light) |")


@pytest.mark.spawns
def test_by_default_the_agents_table_reads_the_users_own_sessions(tmp_path):
    import shutil

    sessions = tmp_path / "data" / "sessions"
    sessions.mkdir(parents=True)
    for log in (REPO / "logs" / "examples").glob("*.jsonl"):
        shutil.copy(log, sessions / log.name)
    env = {**os.environ, "EPIFORGE_DATA_DIR": str(tmp_path / "data")}
    ResultStore(tmp_path / "n.sqlite")
    out = subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--store", str(tmp_path / "n.sqlite")],
                         capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert f"agent sessions: {sessions}" in out.stdout and "| anthropic |" in out.stdout
    empty = {**os.environ, "EPIFORGE_DATA_DIR": str(tmp_path / "nothing")}
    out = subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--store", str(tmp_path / "n.sqlite")],
                         capture_output=True, text=True, cwd=REPO, timeout=120, env=empty)
    assert out.returncode == 0 and "agent sessions:" not in out.stdout and "| anthropic |" not in out.stdout
    # the shipped sessions (logs/generated) are there by default, and --no-shipped leaves them out
    assert lb.SHIPPED_SESSIONS_SOURCE in out.stdout and "| command | claude-subagent" in out.stdout
    assert "## The generated track, per task" in out.stdout
    out = subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--store", str(tmp_path / "n.sqlite"),
                          "--no-shipped"], capture_output=True, text=True, cwd=REPO, timeout=120, env=empty)
    assert out.returncode == 0 and lb.SHIPPED_SESSIONS_SOURCE not in out.stdout and "| command |" not in out.stdout


@pytest.mark.spawns
def test_the_leaderboard_reads_a_store_and_never_writes_one(tmp_path):
    """A typo'd --store is an error, not a new empty store; a file that is no store is left as
    it was; an existing store is read without a write (its bytes unchanged); --html is checked
    before any work and its missing folders made."""
    def board(*args, env=None):
        return subprocess.run([sys.executable, "-m", "epiforge", "leaderboard", "--no-shipped", *args],
                              capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})})

    missing = board("--store", str(tmp_path / "typo.sqlite"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no results store there" in missing.stderr
    assert not (tmp_path / "typo.sqlite").exists()
    script = tmp_path / "empty.py"
    script.write_text("")
    not_store = board(env={"EPIFORGE_RESULTS": str(script)})
    assert not_store.returncode == 2 and "not an epiforge results store" in not_store.stderr
    assert script.read_bytes() == b""
    store_path = tmp_path / "r.sqlite"
    store = ResultStore(store_path)
    store.add(result(task="k1_gemm_rmsnorm", times=((110, 100, 150), (105, 100, 140))))
    before = store_path.read_bytes()
    ok = board("--store", str(store_path), "--html", str(tmp_path / "a" / "b" / "board.html"))
    assert ok.returncode == 0, ok.stderr
    assert "1 result" in ok.stdout and "| k1 | expert | yes |" in ok.stdout
    assert store_path.read_bytes() == before and (tmp_path / "a" / "b" / "board.html").is_file()
    into_dir = board("--store", str(store_path), "--html", str(tmp_path))
    assert into_dir.returncode == 2 and "--html" in into_dir.stderr and "a directory" in into_dir.stderr
    unset = board(env={"EPIFORGE_RESULTS": str(tmp_path / "later.sqlite")})
    assert unset.returncode == 0 and "no results store at" in unset.stderr and not (tmp_path / "later.sqlite").exists()


@pytest.mark.spawns
def test_the_agents_table_counts_tokens_as_the_sessions_list_does():
    """One count of a session's tokens everywhere (cache reads and writes included): the
    leaderboard's tokens / solved is `sessions list`'s tokens over the solved sessions."""
    logs = REPO / "logs" / "examples"
    listed = json.loads(subprocess.run([sys.executable, "-m", "epiforge", "sessions", "list", "--log-dir", str(logs),
                                        "--json"], capture_output=True, text=True, cwd=REPO, timeout=120).stdout)
    solved = [s for s in listed if s["pass"] and s["replay_of"] is None]
    (row,) = lb.agent_rows([logs])
    assert solved and row.solved == len(solved) and row.tokens == sum(s["tokens"] for s in solved)


def test_a_tasks_table_without_baseline_columns_is_still_a_table():
    board = lb.build([result(outcome="INCORRECT_NUMERICS", times=())], [], [])
    rows = [line for line in lb.render_markdown(board).splitlines() if line.startswith("|")]
    assert rows and len({line.count("|") for line in rows if "k1" in line or "---" in line or "task |" in line}) == 1


def test_the_generated_track_per_task_gives_pass_at_k_first_pass_and_generated_over_expert():
    """Per task and agent: sessions, passes, pass@1 and pass@3, turns and wall time to the first
    pass (each passing session's first PASSED evaluation), and generated / expert per shape with
    its interval, from the run that timed both."""
    reps = (1.0, 1.01, 0.99, 1.02, 0.98)
    def shape(name, gen_us, expert_us):
        return ShapeResult(shape=name, dims={}, outcome=Outcome.PASSED, timing=ShapeTiming.measured(
            {"kernel": summarize([gen_us * r for r in reps], keep=True),
             "gemm_only": summarize([100 * r for r in reps], keep=True),
             "kernel:expert": summarize([expert_us * r for r in reps], keep=True)}))
    gen = result(task="k8_gemm_swiglu", track="generated", backend="command", model="m", environment={"gpu": "H100"})
    gen = gen.model_copy(update={"per_shape": [shape("1B", 120, 100), shape("7B", 100, 125)]})
    agents = [lb.AgentRow(backend="command", model="m", tasks={"k8_gemm_swiglu": (4, 3), "k1_gemm_rmsnorm": (2, 0)},
                          first_pass={"k8_gemm_swiglu": [(1, 100.0), (3, 300.0), (2, 200.0)]})]
    text = lb.render_markdown(lb.build([gen], agents))
    table = text.split("## The generated track, per task")[1]
    k8 = next(line for line in table.splitlines() if line.startswith("| k8 |"))
    cells = [c.strip() for c in k8.strip("|").split("|")]
    # pass@1 = 3/4; pass@3 = 1 - C(1,3)/C(4,3) = 1; median turns 2, wall 200 s
    assert "Agent: command / m" in table and "| generated / expert on H100 (bf16) |" in table
    assert cells[:7] == ["k8", "4", "3", "0.75", "1.00", "2", "200 s"]
    assert cells[7].startswith("1B 1.20 [") and ", 7B 0.80 [" in cells[7]
    low, high = (float(x) for x in cells[7].split("[")[1].split("]")[0].split(", "))
    assert low <= 1.20 <= high
    k1 = next(line for line in table.splitlines() if line.startswith("| k1 |"))
    assert [c.strip() for c in k1.strip("|").split("|")][1:8] == ["2", "0", "0.00", "-", "-", "-", "-"]


def test_the_shipped_sessions_count_their_first_pass_as_the_logs_say(tmp_path):
    """agent_rows over logs/generated, against the logs read here as plain JSON lines: per task,
    sessions and passes, and each pass's turn (its first PASSED evaluation's step + 1)."""
    want: dict[str, list] = {}
    for path in sorted(lb.SHIPPED_SESSIONS.glob("*.jsonl")):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        task = events[0]["config"]["task"]
        end = [e for e in events if e["event"] == "session_ended"][-1]
        first = next((e for e in events if e["event"] == "evaluation" and e["outcome"] == "PASSED"), None)
        if end["outcome"] == "backend_error" or (end["outcome"] == "budget_exhausted" and not end["totals"]["turns"]):
            continue  # not counted in pass@k (agent/sessions.py counts_as_pass)
        passed = end["outcome"] in ("passed", "passed_slow")
        want.setdefault(task, []).append((passed, None if first is None else first["step"] + 1))
    (row,) = [r for r in lb.agent_rows([lb.SHIPPED_SESSIONS]) if r.backend == "command"]
    assert set(row.tasks) == set(want) and len(want) >= 14
    for task, ends in want.items():
        assert row.tasks[task] == (len(ends), sum(ok for ok, _ in ends)), task
        assert sorted(t for t, _ in row.first_pass.get(task, [])) == sorted(t for ok, t in ends if ok), task
    # a session's log in two folders (the user's data directory, and the copy shipped) counts once
    import shutil

    for log in sorted(lb.SHIPPED_SESSIONS.glob("*.jsonl"))[:3]:
        shutil.copy(log, tmp_path / log.name)
    (twice,) = [r for r in lb.agent_rows([lb.SHIPPED_SESSIONS, tmp_path]) if r.backend == "command"]
    assert twice.tasks == row.tasks and twice.first_pass == row.first_pass
