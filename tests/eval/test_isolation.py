"""Isolation and faults on a CPU: after an infinite loop, a segfault, a Python exception, a
memory blowup and a forged result channel, the harness is fine and the next candidate
PASSES; the worker's environment holds no secrets; the timeout kills the whole process
group; a death while compiling is a COMPILE_ERROR; the CLI answers in one line."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval import evaluate
from eval.evaluation import _from_worker
from eval.isolation import WorkerRun

REPO = Path(__file__).resolve().parents[2]
EXPLOITS = REPO / "tests" / "exploits"


@pytest.mark.parametrize("fault,expect,kw", [
    ("infinite_loop", "TIMEOUT", {"timeout_s": 12}),
    ("segfault", "RUNTIME_ERROR", {"static_checks": False}),
    ("raises", "RUNTIME_ERROR", {}),
    ("memory_blowup", "RUNTIME_ERROR", {"memory_limit_gib": 4}),
    ("fake_result_channel", "RUNTIME_ERROR", {"static_checks": False}),
])
def test_the_next_candidate_passes_after_a_fault(fault, expect, kw):
    bad = evaluate("k1", str(EXPLOITS / f"{fault}.py"), seed=3, **kw)
    assert bad.outcome.value == expect, bad.message
    assert bad.stage and not bad.timed
    if fault == "segfault":
        assert "SIGSEGV" in bad.message
    if fault == "raises":
        assert "kernel exploded on purpose" in bad.message and "Traceback" in bad.stderr_tail
    if fault == "infinite_loop":
        assert bad.wall_s < 12 + 10
    good = evaluate("k1", "human", seed=3)
    assert good.passed, good.message + good.stderr_tail


def test_the_worker_sees_no_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-do-not-leak")
    monkeypatch.setenv("GITHUB_PAT", "ghp-do-not-leak")
    monkeypatch.setenv("EPIFORGE_FAKE_SECRET_TOKEN", "tok-do-not-leak")
    r = evaluate("k1", str(EXPLOITS / "leaks_env.py"), seed=1, static_checks=False)
    assert r.outcome.value == "RUNTIME_ERROR" and "ENV " in r.message and "PATH=" in r.message
    text = r.message + r.stderr_tail
    assert "do-not-leak" not in text and "ANTHROPIC" not in text and "GITHUB_PAT" not in text


def test_the_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    kernel = tmp_path / "k1_spawns.py"
    kernel.write_text(
        '"""Leaves a child behind and hangs."""\nimport subprocess\nTASK = "k1_gemm_rmsnorm"\n\n'
        "def run(inputs, prepared, config=None):\n"
        f"    p = subprocess.Popen(['sleep', '300'])\n    open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "    while True:\n        pass\n")
    r = evaluate("k1", str(kernel), seed=1, timeout_s=10, static_checks=False)
    assert r.outcome.value == "TIMEOUT"
    pid = int(pidfile.read_text())
    for _ in range(50):  # killed with the group (a zombie until reaped by init counts as gone)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the kernel's child outlived the timeout")


def test_a_death_while_compiling_is_a_compile_error():
    base = dict(task="k1_gemm_rmsnorm", kernel="k.py", kernel_sha256="0" * 64, track="candidate", device="cpu",
                shapes="smoke", environment={})
    crashed = _from_worker(WorkerRun(stage="compile", returncode=-11), base, 60)
    assert crashed.outcome.value == "COMPILE_ERROR" and "SIGSEGV" in crashed.message
    died = _from_worker(WorkerRun(stage="numerics", returncode=-6), base, 60)
    assert died.outcome.value == "RUNTIME_ERROR" and "SIGABRT" in died.message and "numerics" in died.message
    late = _from_worker(WorkerRun(stage="benchmark", timed_out=True), base, 60)
    assert late.outcome.value == "TIMEOUT" and "benchmark" in late.message


def cli(*args):
    return subprocess.run([sys.executable, str(REPO / "epiforge.py"), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_cli_eval_records_and_answers(tmp_path):
    db = tmp_path / "results.sqlite"
    out = cli("eval", "--task", "k1", "--kernel", str(EXPLOITS / "torch_matmul.py"), "--json", "--store", str(db))
    assert out.returncode == 1
    r = json.loads(out.stdout)
    assert r["outcome"] == "STATIC_REJECTED" and r["stage"] == "static" and r["violations"]
    out = cli("eval", "--task", "k1", "--kernel", str(EXPLOITS / "first_row_only.py"), "--store", str(db))
    assert out.returncode == 1 and "INCORRECT_NUMERICS" in out.stdout and "worst" in out.stdout
    from eval.store import ResultStore

    rows = ResultStore(db).rows()
    assert [x["outcome"] for x in rows] == ["INCORRECT_NUMERICS", "STATIC_REJECTED"]
    bad = cli("eval", "--task", "k1", "--kernel", "human", "--shapes", "huge")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown shape set" in bad.stderr
