"""Where sessions write (issue 14, section 5): logs and kernels go where the flags say, by
default under the per-user data directory, never into the source tree unless asked; and an
unfinished session is not counted in pass@k, by `generate --runs` and the leaderboard alike."""

import json
import subprocess
from pathlib import Path

import pytest
from loopback import Loopback, Reply
from scenarios import K1_GOOD

from epiforge import cli as epiforge
from epiforge.agent.loop import beside, data_path
from epiforge.agent.runs import Run, render, report
from epiforge.agent.session import SessionConfig, read_events
from epiforge.eval.machine import REPO, data_dir

PRICED = "claude-sonnet-4-5-loopback"
FAST = ["--no-compile", "--device", "cpu"]
WATCHED = ("logs", "generated_kernels")  # the repository's folders a session used to write into


def _repo_status() -> list[str]:
    """git status of the watched folders only (other people change other paths meanwhile)."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *WATCHED], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return sorted(out.splitlines())


def _generate(capsys, *argv):
    rc = epiforge.main(["generate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_data_directory_is_the_flag_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EPIFORGE_DATA_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "mine"
    monkeypatch.delenv("EPIFORGE_DATA_DIR")
    assert data_dir() == tmp_path / "xdg" / "epiforge"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/path")  # the XDG spec: a relative one is ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "epiforge"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "epiforge"


def test_kernels_and_workspaces_go_beside_a_log_folder_never_into_the_repo(tmp_path):
    data = tmp_path / "data"  # the conftest's EPIFORGE_DATA_DIR
    assert data_path("sessions") == data / "sessions"
    assert beside(data / "sessions", "kernels") == data / "kernels"
    assert beside(data / "ablations" / "20261201T000000Z", "workspaces") == data / "workspaces"
    assert beside(REPO / "logs", "kernels") == data / "kernels"  # a log folder in the repo: its kernels are not
    assert beside(tmp_path / "runs", "kernels") == (tmp_path / "runs" / "generated_kernels").resolve()
    assert beside(tmp_path / "runs", "workspaces") == (tmp_path / "runs" / "workspaces").resolve()


@pytest.mark.spawns
def test_a_session_with_no_folder_flags_writes_only_into_the_data_directory(tmp_path, monkeypatch, anthropic_key,
                                                                              capsys):
    data = tmp_path / "elsewhere"
    monkeypatch.setenv("EPIFORGE_DATA_DIR", str(data))
    before = _repo_status()
    script = [Reply("writing and submitting", [("write_kernel", {"source": K1_GOOD}), ("submit", {})])]
    with Loopback("anthropic", script, model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--max-turns", "1", "--json", *FAST)
    assert rc == 0, err
    end = json.loads(out)
    (log,) = (data / "sessions").glob("*.jsonl")
    session = read_events(log)[0][0].session
    assert end["outcome"] == "passed" and log.name == f"{session}.jsonl"
    (submitted,) = [e for e in read_events(log)[0] if e.event == "tool_result" and e.name == "submit"]
    import torch

    if not torch.cuda.is_available():  # a CPU pass is labelled provisional in the agent's submit too
        assert submitted.content.startswith("accepted, provisionally: correct on the CPU emulator"), submitted.content
    kernel = data / "kernels" / "k1_gemm_rmsnorm" / f"{session}.py"
    assert end["generated_kernel"] == str(kernel) and kernel.is_file()
    assert (data / "workspaces" / session / "kernel.py").read_text() == K1_GOOD
    assert _repo_status() == before  # nothing new under logs/ or generated_kernels/
    assert not (REPO / "generated_kernels" / "k1_gemm_rmsnorm" / f"{session}.py").exists()

    # sessions list and show find it in the data directory, and in --log-dir
    for flags in ([], ["--log-dir", str(data / "sessions")]):
        assert epiforge.main(["sessions", "list", "--json", *flags]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert (row["session"], row["outcome"], row["kernel"], row["pass"]) == (session, "passed", str(kernel), True)
    assert epiforge.main(["sessions", "show", session]) == 0
    assert f"log: {log}" in capsys.readouterr().out

    # compare and eval find it there too, as a generated kernel, by ID or by where it came from
    from epiforge.eval.compare import select_kernels
    from epiforge.eval.kernel import read_kernel, resolve_kernel

    assert (f"generated:{session}", kernel) in select_kernels("k1", ["generated"])  # beside the repository's own
    assert select_kernels("k1", [f"generated:session={session}"]) == select_kernels("k1", [f"generated:{session}"])
    assert select_kernels("k1", ["generated:backend=anthropic"]) == [(f"generated:{session}", kernel)]
    assert resolve_kernel(f"generated:{session}", "k1_gemm_rmsnorm") == kernel
    assert read_kernel(kernel).track == "generated"
    with pytest.raises(ValueError, match="no generated kernel of k1_gemm_rmsnorm matches"):
        select_kernels("k1", ["generated:model=another-model"])


def test_sessions_list_before_any_session_says_so(tmp_path, capsys):
    assert epiforge.main(["sessions", "list"]) == 0
    assert capsys.readouterr().out.strip() == f"no sessions in {tmp_path / 'data' / 'sessions'}"


@pytest.mark.spawns
def test_an_unfinished_run_is_not_counted_in_pass_at_k_here_or_on_the_leaderboard(tmp_path, anthropic_key, capsys):
    logs = tmp_path / "runs"
    script = [Reply("writing and submitting", [("write_kernel", {"source": K1_GOOD}), ("submit", {})]),
              Reply("thinking it over"), Reply("still thinking")]
    with Loopback("anthropic", script, model=PRICED) as server:
        rc, out, err = _generate(capsys, "--task", "k1", "--backend", "anthropic", "--model", PRICED, "--base-url",
                                 server.url, "--runs", "3", "--max-turns", "1", "--log-dir", str(logs), "--json",
                                 *FAST)
    assert rc == 0, err
    rep = json.loads(out)
    assert (rep["n"], rep["passed"], rep["unfinished"]) == (3, 1, 0)
    assert sorted(r["pass"] for r in rep["runs"]) == [False, False, True]

    # one failed run is killed before its end (its session_ended line lost): it is unfinished now
    (failed, _) = [r for r in rep["runs"] if not r["pass"]]
    path = Path(failed["log"])
    lines = path.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["event"] == "session_ended"
    path.write_text("".join(lines[:-1]))
    runs = [Run(r["run"], r["session"], Path(r["log"])) for r in rep["runs"]]
    config = SessionConfig(task="k1_gemm_rmsnorm", backend="anthropic", model=PRICED)
    again = report(config, [r.row() for r in runs])
    assert (again["n"], again["passed"], again["unfinished"]) == (2, 1, 1)
    assert again["pass_at_k"] == {"1": pytest.approx(0.5), "2": 1.0}  # over the 2 finished runs, not 3
    assert [r["log"] for r in again["runs"] if r["outcome"] == "unfinished"] == [str(path)]
    assert str(path) in again["to_resume"]
    text = render(again)
    assert text.splitlines()[0] == f"3 runs of k1_gemm_rmsnorm with anthropic / {PRICED}: 1 passed, 1 unfinished"
    assert "over the 2 finished runs" in text and "1 run(s) not counted (unfinished, or ended by a backend error)" in text

    from epiforge.eval.leaderboard import agent_rows

    (board,) = agent_rows([logs])  # the leaderboard counts the same sessions
    assert board.tasks == {"k1_gemm_rmsnorm": (2, 1)}
    assert board.pass_at(1) == pytest.approx(again["pass_at_k"]["1"])


def test_no_finished_run_means_no_pass_at_k():
    config = SessionConfig(task="k1_gemm_rmsnorm", backend="anthropic", model=PRICED)
    row = {"run": 1, "session": "s", "outcome": "unfinished", "reason": "killed", "turns": 1, "tokens": 10,
           "cost_usd": 0.01, "kernel": None, "pass": None, "log": "s.jsonl"}
    rep = report(config, [row])
    assert (rep["n"], rep["unfinished"], rep["pass_at_k"]) == (0, 1, {})
    assert "pass@k: no run finished; 1 run(s) not counted (unfinished, or ended by a backend error)" in render(rep)


def test_a_run_ended_by_a_backend_error_is_not_counted_but_listed_to_resume():
    config = SessionConfig(task="k1_gemm_rmsnorm", backend="anthropic", model=PRICED)
    base = {"reason": "", "turns": 1, "tokens": 10, "cost_usd": 0.01, "kernel": None}
    rows = [base | {"run": 1, "session": "a", "outcome": "passed", "pass": True, "log": "a.jsonl"},
            base | {"run": 2, "session": "b", "outcome": "gave_up", "pass": False, "log": "b.jsonl"},
            base | {"run": 3, "session": "c", "outcome": "backend_error", "pass": None, "log": "c.jsonl"}]
    rep = report(config, rows)
    assert (rep["n"], rep["passed"], rep["not_counted"], rep["unfinished"]) == (2, 1, 1, 0)
    assert rep["pass_at_k"] == {"1": pytest.approx(0.5), "2": 1.0} and rep["to_resume"] == ["c.jsonl"]
    assert render(rep).splitlines()[0] == f"3 runs of k1_gemm_rmsnorm with anthropic / {PRICED}: 1 passed, 1 ended by a backend error"


def test_a_default_folder_that_cannot_be_written_names_the_data_directory(tmp_path, monkeypatch, capsys):
    """No flag named the folder, so the line names what does: EPIFORGE_DATA_DIR."""
    (tmp_path / "a-file").write_text("not a folder\n")
    monkeypatch.setenv("EPIFORGE_DATA_DIR", str(tmp_path / "a-file" / "data"))
    example = next((REPO / "logs" / "examples").glob("*.jsonl"))
    assert epiforge.main(["replay", str(example)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"epiforge: {tmp_path / 'a-file' / 'data' / 'replays'} (the data directory's; EPIFORGE_DATA_DIR "
                   f"moves it): {tmp_path / 'a-file'} is not a directory"]
    bad = tmp_path / "a-file" / "logs"  # a flag's folder is still named by its flag
    assert epiforge.main(["replay", str(example), "--log-dir", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"epiforge: --log-dir {bad}: {tmp_path / 'a-file'} is not a directory"
