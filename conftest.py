"""The test setup of both test folders, the product's (tests/) and the lab's (lab/tests/):
the `gpu` marker skips without a Hopper GPU; the `sandbox` marker skips where the machine
forbids the runner's namespaces (then the runner says so in every Result, and these tests
have nothing to test); a test that starts a process must carry the `spawns` marker (seen
through Python's audit hooks; GPU tests carry it by default), so that `-m "not spawns"` is
the suite's quick part. Every test gets its own data directory; Ctrl-C tests take
`ctrl_c_reaches_children`."""

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

# The test processes pin the CPU numerics as the judge's processes do (eval/isolation.py
# NUMERICS_PINS, read by MKL when it starts, so before torch is imported): the tests that
# compare two in-process runs bit for bit (tests/primitives/test_program.py, test_epilogue_graph.py)
# then see MKL take the same path both times.
from epiforge.eval.isolation import NUMERICS_PINS  # noqa: E402 - imports no torch

os.environ.update(NUMERICS_PINS)

import pytest  # noqa: E402 - after the numerics pins

FULL_SANDBOX = "user and mount namespaces: read-only filesystem but its own dir, no network"
_PROBE = ("import pathlib, sys, tempfile; sys.path.insert(0, sys.argv[1]); from epiforge.eval.isolation import sandbox; "
          "print(sandbox(pathlib.Path(tempfile.mkdtemp())))")


@functools.lru_cache(maxsize=None)
def runner_sandbox() -> str:
    """What eval.isolation.sandbox achieves on this machine (in a throwaway process)."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(Path(__file__).resolve().parent)],
                         capture_output=True, text=True, timeout=60)
    return (out.stdout.strip().splitlines() or [out.stderr.strip()[-200:]])[-1]


@pytest.fixture(autouse=True)
def _data_dir_in_tmp(tmp_path, monkeypatch):
    """Every test: sessions that name no log folder, workspace or kernel folder write under
    the test's tmp dir (the data directory, eval/machine.py data_dir()), not the user's, and
    lookups there (generated kernels, sessions) see only what the test put there."""
    monkeypatch.setenv("EPIFORGE_DATA_DIR", str(tmp_path / "data"))
    # the pack's screen writes verdicts it has not shipped to the user cache: keep it in tmp
    monkeypatch.setenv("EPIFORGE_SCREEN_CACHE", str(tmp_path / "screen_cache.json"))


@pytest.fixture
def ctrl_c_reaches_children():
    """Children started during the test take SIGINT as from a terminal. A suite started in
    the background by a shell without job control inherits SIGINT ignored, and so would every
    CLI it starts (exec keeps an ignored signal ignored, and Python then installs no
    KeyboardInterrupt handler): a Ctrl-C test would see a CLI that never hears Ctrl-C."""
    inherited = signal.getsignal(signal.SIGINT)
    if inherited == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a caught signal is SIG_DFL after exec
    yield
    signal.signal(signal.SIGINT, inherited)


#: the audit events (sys.addaudithook) of a process starting: CPython's, and the warm judges'
#: (eval/judge_zygote.py: this process asks a zygote to fork one)
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                          "os.exec", "pty.spawn", "epiforge.judge_zygote.fork"})
#: EPIFORGE_TEST_SPAWNS_RECORD=FILE: each test that started a process is a line of FILE
#: ("nodeid<TAB>phases"), and none fails for it (how the markers were first placed)
RECORD_ENV = "EPIFORGE_TEST_SPAWNS_RECORD"
_phase: list = [None]
_spawned_in: set = set()


def _audit(event, args):
    if _phase[0] is not None and event in SPAWN_EVENTS:
        _spawned_in.add(_phase[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _spawned_in.clear()
    _phase[0] = "setup"
    yield
    _phase[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _phase[0] = "call"
    yield
    _phase[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    _phase[0] = "teardown"
    yield
    _phase[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that starts a process (a judge, the CLI, a cross-compile) carries the `spawns`
    marker, so that `-m "not spawns"` is the suite's quick part: one that does not fails here,
    at its teardown, saying so."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "teardown" or not _spawned_in:
        return
    phases = ",".join(sorted(_spawned_in))
    record = os.environ.get(RECORD_ENV)
    if record:
        with open(record, "a") as f:
            f.write(f"{item.nodeid}\t{phases}\n")
    elif item.get_closest_marker("spawns") is None and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process (in its {phases}) and carries no `spawns` marker: "
                           "mark it, or its module (pytestmark = pytest.mark.spawns)")


def pytest_configure(config):
    """In each of pytest-xdist's workers (before any test module imports torch): the CPU math
    libraries' threads for the worker and everything it starts are the cores shared out among
    the workers. A judge's processes compute at the same time; with each at the machine's
    core count, two layer evaluations side by side on 2 cores took about four times as long
    as with 1 thread each (OpenMP's threads spin while they wait;
    lab/results/cpu/thread-share.json, lab/bench/thread_share.py). A count the user set stands."""
    # the suite's thousands of in-process evaluations: each judge forked by a warm zygote
    # (eval/judge_zygote.py) instead of a new Python importing torch (CLIs the tests start
    # judge the plain way)
    sys.addaudithook(_audit)  # for the `spawns` marker (pytest_runtest_makereport)
    from epiforge.eval.judge_zygote import warm_judges

    warm_judges(os.environ.get("EPIFORGE_TEST_WARM_JUDGES") != "0")  # 0: each judge a new process
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers and not os.environ.get("OMP_NUM_THREADS"):
        threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads
        if "torch" in sys.modules:  # read at its import: a plugin imported it first
            sys.modules["torch"].set_num_threads(int(threads))


def _hopper() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    for item in items:  # a GPU test runs judges or the GPU's own processes: it spawns wherever it runs
        if "gpu" in item.keywords and item.get_closest_marker("spawns") is None:
            item.add_marker(pytest.mark.spawns)
    if any("sandbox" in item.keywords for item in items) and runner_sandbox() != FULL_SANDBOX:
        skip_sandbox = pytest.mark.skip(reason=f"this machine gives the runner less than its sandbox: {runner_sandbox()}")
        for item in items:
            if "sandbox" in item.keywords:
                item.add_marker(skip_sandbox)
    if _hopper():
        return
    skip = pytest.mark.skip(reason="needs a Hopper (sm_90) GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_CROSS_COMPILE = '''
import json, os, sys
os.environ.update(EPIFORGE_CROSS_COMPILE="1", CUTE_DSL_ARCH="sm_90a", QUACK_ARCH="90")
import torch
import epiforge
import primitives as P
kernel, calls = json.load(sys.stdin)
scope = {"torch": torch, "P": P}
exec(compile(kernel, "kernel.py", "exec"), scope)
exec(compile(calls, "calls.py", "exec"), scope)
from epiforge.primitives.lowering import COMPILE_LOG
print("LOG" + json.dumps(COMPILE_LOG))
'''


@pytest.fixture
def sm90a_compile_log(tmp_path):
    """compile(kernel_source, calls) -> the primitives' COMPILE_LOG after `calls` (code that
    sees the kernel's names, torch and P) ran with the kernel cross-compiled for sm_90a, in a
    fresh process with its own quack cache."""
    import json
    import os

    repo = Path(__file__).resolve().parent

    def compile_(kernel: str, calls: str) -> list[dict]:
        env = {**os.environ, "QUACK_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(repo)}
        proc = subprocess.run([sys.executable, "-c", _CROSS_COMPILE], input=json.dumps([kernel, calls]),
                              capture_output=True, text=True, env=env, cwd=repo, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (log,) = [json.loads(ln[3:]) for ln in proc.stdout.splitlines() if ln.startswith("LOG")]
        return log

    return compile_
