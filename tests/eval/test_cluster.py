"""compare on a Ray cluster (eval/cluster.py): a local cluster on this CPU machine whose
workers stand in for GPUs through a custom resource, a worker killed mid-evaluation, and
every Result stored exactly once."""

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epiforge.eval.machine import REPO

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'epiforge[ray]')")
pytestmark = pytest.mark.spawns  # Ray's processes, and each task's judge

EXPERT = REPO / "human_kernels"


def _kill_first_worker(progress: Path, task: str, stop: threading.Event, killed: list) -> None:
    """Kill (SIGKILL) the worker of `task`'s first attempt once its judge has had a moment to start."""
    while not stop.is_set():
        marks = sorted(progress.glob(f"{task}.*"))
        if marks:
            pid = int(marks[0].name.rsplit(".", 1)[1])
            time.sleep(1.5)  # inside the evaluation: the judge is loading or checking
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.05)


def test_a_killed_worker_is_retried_and_every_result_is_stored_once(tmp_path, monkeypatch):
    from epiforge.eval.cluster import PROGRESS_DIR_ENV, compare_on_ray, evaluation_key
    from epiforge.eval.store import ResultStore

    progress = tmp_path / "progress"
    progress.mkdir()
    monkeypatch.setenv(PROGRESS_DIR_ENV, str(progress))  # the workers inherit it from the cluster started here
    plans = [("k1_gemm_rmsnorm", [("expert", EXPERT / "k1_gemm_rmsnorm.py")]),
             ("k8_gemm_swiglu", [("expert", EXPERT / "k8_gemm_swiglu.py"),
                                 ("again", EXPERT / "k8_gemm_swiglu.py")]),
             ("x9_no_such_task", [("expert", EXPERT / "k1_gemm_rmsnorm.py")])]  # its compare raises on the worker
    store = ResultStore(tmp_path / "r.sqlite")
    ray.init(num_cpus=2, resources={"emulated_gpu": 2}, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_first_worker, args=(progress, "k8_gemm_swiglu", stop, killed))
    watcher.start()
    heard = []
    try:
        got = compare_on_ray(plans, device="cpu", shapes="smoke", seed=7, dtype="bf16", run="run1",
                             resources={"num_cpus": 0, "resources": {"emulated_gpu": 1}}, store=store,
                             on_done=heard.append)
    finally:
        stop.set()
        watcher.join()
        ray.shutdown()
    assert killed, "the watcher never saw k8's worker start"
    assert len(list(progress.glob("k8_gemm_swiglu.*"))) == 2  # the killed attempt, then the retry
    assert [c.task for c in got] == ["k1_gemm_rmsnorm", "k8_gemm_swiglu", "x9_no_such_task"]  # the plans' order
    assert sorted(c.task for c in heard) == ["k1_gemm_rmsnorm", "k8_gemm_swiglu", "x9_no_such_task"]
    *judged, lost = got
    assert all(r.passed and r.provisional for c in judged for r in c.results), [r.message for c in got for r in c.results]
    (r,) = lost.results
    assert r.outcome.value == "RUNTIME_ERROR" and r.message.startswith("the cluster could not run this task")
    assert "x9_no_such_task" in r.message and r.kernel_sha256 == judged[0].results[0].kernel_sha256
    with sqlite3.connect(store.path) as db:
        keys = [k for (k,) in db.execute("SELECT eval_key FROM evaluations ORDER BY eval_key")]
    assert keys == sorted([evaluation_key("run1", "k1_gemm_rmsnorm", "expert"),
                           evaluation_key("run1", "k8_gemm_swiglu", "again"),
                           evaluation_key("run1", "k8_gemm_swiglu", "expert"),
                           evaluation_key("run1", "x9_no_such_task", "expert")])
    # a retried evaluation that reaches the head again is not stored twice
    first = store.rows()[0]
    assert store.add(first.result, key=evaluation_key("run1", first.result.task, "expert")) in {r.id for r in store.rows()}
    assert len(store.rows()) == 4


def test_without_ray_the_cli_says_what_to_install(tmp_path):
    """--ray where Ray cannot be imported: one line, exit 2, nothing judged."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "ray.py").write_text("raise ImportError('no ray here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "epiforge", "compare", "--task", "k1", "--device", "cpu", "--ray"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["epiforge: --ray needs Ray: pip install 'epiforge[ray]'"]
    assert out.stdout == ""


@pytest.mark.parametrize("argv,line", [
    (["--ray"], "--ray: name the workers' device, --device gpu or --device cpu"),
    (["--ray", "--device", "cpu", "--warm"], "--warm builds the baselines on this machine; on --ray each worker "
                                             "builds its own"),
])
def test_ray_options_this_machine_cannot_decide_are_one_line(argv, line, capsys):
    from epiforge import cli

    assert cli.main(["compare", "--task", "k1", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"epiforge: {line}"]
