"""Isolation and faults on a CPU: after an infinite loop, a segfault, a Python exception, a
memory blowup and a forged result channel, the harness is fine and the next candidate
PASSES; the runner's environment holds no secrets; the timeout kills the whole process
group; a death while compiling is a COMPILE_ERROR; a killed CLI leaves no process and no
temp dir behind; the judge is out of the runner's reach; the CLI answers in one line."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epiforge.eval import evaluate
from epiforge.eval.evaluation import _from_judge
from epiforge.eval.isolation import NO_UNIX_SOCKETS, TEMP_PREFIX, JudgeRun
from epiforge.eval.remote import KernelFailure, KernelProcess

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

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
    # where the time went: every stage it passed through, and no more than the whole took
    assert {"load", "numerics"} <= good.stage_s.keys() and 0 < sum(good.stage_s.values()) <= good.wall_s
    assert good.environment["runner_syscalls"] == NO_UNIX_SOCKETS


def test_the_worker_sees_no_secrets(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-do-not-leak")
    monkeypatch.setenv("GITHUB_PAT", "ghp-do-not-leak")
    monkeypatch.setenv("EPIFORGE_FAKE_SECRET_TOKEN", "tok-do-not-leak")
    r = evaluate("k1", str(EXPLOITS / "leaks_env.py"), seed=1, static_checks=False)
    assert r.outcome.value == "RUNTIME_ERROR" and "ENV " in r.message and "PATH=" in r.message
    text = r.message + r.stderr_tail
    assert "do-not-leak" not in text and "ANTHROPIC" not in text and "GITHUB_PAT" not in text


def test_a_runner_is_a_spare_the_judge_forked_unless_turned_off(tmp_path, monkeypatch):
    """By default the runner is one of the spares the judge forked before it read the
    request (eval/runner.py fork_spares: its command line is the judge's); with
    EPIFORGE_RUNNER_SPARES=0 a new process. Either way it is shut in alike, in the same
    kind of dir, with the same environment. What a spare holds is checked by
    frame_walk_finds_nothing.py (no seed, task or reference) in the exploit suite."""
    kernel = tmp_path / "says_who.py"
    kernel.write_text('"""Says which process runs it."""\nimport os\n\nTASK = "k1_gemm_rmsnorm"\n\n\n'
                      "def run(inputs, prepared, config=None):\n"
                      "    cmd = open('/proc/self/cmdline').read().replace(chr(0), ' ')\n"
                      "    env = ' '.join(sorted(k for k in os.environ))\n"
                      "    raise RuntimeError(f'CMD {cmd} ENV {env} CWD {os.getcwd()}')\n")
    seen = {}
    for spares in ("1", "0"):
        monkeypatch.setenv("EPIFORGE_RUNNER_SPARES", spares)
        r = evaluate("k1", str(kernel), seed=1, static_checks=False, launcher=False)
        assert r.outcome.value == "RUNTIME_ERROR" and "CMD " in r.message, r.message
        cmd, rest = r.message.split("CMD ", 1)[1].split(" ENV ")
        env, cwd = rest.split(" CWD ")
        seen[spares] = (cmd, set(env.split()) - {"EPIFORGE_RUNNER_SPARES"}, cwd.strip(), r.environment["runner_sandbox"])
    # a spare's command line is its judge's: a judge forked by the suite's warm zygote has the zygote's
    assert re.search(r"-m epiforge\.eval\.judge(_zygote)? ", seen["1"][0]) and "-m epiforge.eval.runner " in seen["0"][0], seen
    assert {"HOME", "TMPDIR", "QUACK_CACHE_DIR", "PYTHONHASHSEED"} <= seen["1"][1]
    assert seen["1"][1] == seen["0"][1]  # the same names; their values are per runner (its dir)
    assert all("/runner-" in seen[s][2] for s in seen), seen
    assert seen["1"][3] == seen["0"][3], seen  # shut in alike


def test_the_timeout_kills_the_whole_process_group(tmp_path):
    marker = str(3000 + os.getpid() % 1000)  # a sleep nobody else runs
    kernel = tmp_path / "k1_spawns.py"
    kernel.write_text(
        '"""Leaves a child behind and hangs."""\nimport subprocess\nTASK = "k1_gemm_rmsnorm"\n\n'
        "def run(inputs, prepared, config=None):\n"
        f"    subprocess.Popen(['sleep', '{marker}'])\n"
        "    while True:\n        pass\n")
    r = evaluate("k1", str(kernel), seed=1, timeout_s=10, static_checks=False)
    assert r.outcome.value == "TIMEOUT", r.message

    def sleepers():
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and (proc / "cmdline").read_bytes() == f"sleep\0{marker}\0".encode() \
                        and (proc / "stat").read_text().split()[2] != "Z":
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    for _ in range(50):  # killed with the group (a zombie until reaped counts as gone)
        if not sleepers():
            break
        time.sleep(0.1)
    else:
        for pid in sleepers():
            os.kill(pid, 9)
        pytest.fail("the kernel's child outlived the timeout")


def test_a_death_while_compiling_is_a_compile_error(tmp_path):
    kp = KernelProcess(tmp_path / "runner", deadline=time.monotonic() + 120)
    try:
        kp.ask({"op": "ping"}, stage="load")
        kp.building = True  # as when the runner announced a kernel build (primitives/trace.py)
        # the runner proper is the child its first process forked into its own PID namespace;
        # as that namespace's PID 1 it takes only SIGKILL from outside (a real crash is its own)
        children = Path(f"/proc/{kp.proc.pid}/task/{kp.proc.pid}/children").read_text().split()
        os.kill(int(children[0]) if children else kp.proc.pid, 9)
        with pytest.raises(KernelFailure) as died:
            kp.ask({"op": "ping"}, stage="compile")
        assert died.value.outcome == "COMPILE_ERROR" and "SIGKILL" in died.value.message
    finally:
        kp.close()


def test_a_judge_that_ends_without_a_verdict_is_named():
    base = dict(task="k1_gemm_rmsnorm", kernel="k.py", kernel_sha256="0" * 64, track="candidate", device="cpu",
                shapes="smoke", environment={})
    died = _from_judge(JudgeRun(stage="numerics", returncode=-6), base, 60)
    assert died.outcome.value == "RUNTIME_ERROR" and "SIGABRT" in died.message and "numerics" in died.message
    late = _from_judge(JudgeRun(stage="benchmark", timed_out=True), base, 60)
    assert late.outcome.value == "TIMEOUT" and "benchmark" in late.message


def _ours(*markers: str) -> list[int]:
    """Live (non-zombie) processes whose command line or environment names a marker."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().split()[2] == "Z":
                continue
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if any(m.encode() in blob for m in markers):
            pids.append(int(proc.name))
    return pids


def _kill_midway_and_find_nothing_left(proc, marker: str, tmp_path: Path, signum: int, up: int) -> None:
    """Once `up` processes carry the marker and the runner's dir exists, wait 2 s (inside
    run() by then) and send `proc` signum: then no marked process and no temp dir may be left."""
    try:
        for _ in range(600):
            if len(_ours(marker, str(tmp_path))) >= up and any(tmp_path.glob(f"{TEMP_PREFIX}*/runner-*")):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the evaluation did not start")
        time.sleep(2)
        proc.send_signal(signum)
        proc.wait(timeout=30)
        for _ in range(100):
            if not _ours(marker, str(tmp_path)) and not list(tmp_path.glob(f"{TEMP_PREFIX}*")):
                break
            time.sleep(0.1)
        left = _ours(marker, str(tmp_path))
        for pid in left:
            os.kill(pid, 9)
        assert not left, f"processes left running: {left}"
        assert not list(tmp_path.glob(f"{TEMP_PREFIX}*")), "a temp dir was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_cli_leaves_nothing_behind(tmp_path, how, ctrl_c_reaches_children):
    """kill -9 (or Ctrl-C) the CLI while a spinning kernel runs: the judge and the runner
    die with it, and the evaluation's temp dir is gone."""
    marker = f"epiforge-test-{os.getpid()}-{how}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "EPIFORGE_TEST_MARKER": marker}
    cli_proc = subprocess.Popen([sys.executable, "-m", "epiforge", "eval", "--task", "k1", "--kernel",
                                 str(EXPLOITS / "infinite_loop.py"), "--timeout", "300"], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_midway_and_find_nothing_left(cli_proc, marker, tmp_path, 9 if how == "SIGKILL" else 2, up=3)


def test_a_warm_judge_judges_as_a_new_process_does(monkeypatch):
    """eval/judge_zygote.py: a judge forked by the warm zygote (what this suite runs on) gives
    the verdict a judge started afresh gives, numbers and all; its first stage counts from its
    fork, not from the zygote's start; one zygote serves every environment that differs only in
    LATE_ENV (each test's data directory), another environment gets its own."""
    from epiforge.eval import judge_zygote

    def verdict(r):
        return r.outcome, [(s.shape, s.dtype, [(c.name, c.max_error) for c in s.outputs]) for s in r.per_shape]

    judge_zygote.warm_judges(False)
    try:
        fresh = evaluate("k1", "human", seed=5)
        judge_zygote.warm_judges(True)
        warm = evaluate("k1", "human", seed=5)
        time.sleep(1.5)  # the zygote idles: a judge forked now must not count it
        monkeypatch.setenv("EPIFORGE_DATA_DIR", str(Path(judge_zygote.__file__).parent))  # late: same zygote
        again = evaluate("k1", "human", seed=5)
        assert len(judge_zygote._zygotes) == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
        other = evaluate("k1", "human", seed=5)
        assert len(judge_zygote._zygotes) == 2  # read at import: a zygote of its own
    finally:
        judge_zygote.warm_judges(True)
    assert fresh.passed and verdict(warm) == verdict(fresh) == verdict(again) == verdict(other)
    assert again.stage_s["load"] < 1.0, again.stage_s


def test_a_killed_harness_with_warm_judges_leaves_nothing_behind(tmp_path):
    """kill -9 a harness whose judges come from a warm zygote, while a spinning kernel runs:
    the zygote dies with the harness, the judge with the zygote, the runner with the judge,
    and the evaluation's temp dir is gone."""
    marker = f"epiforge-test-{os.getpid()}-warm"
    env = {**os.environ, "TMPDIR": str(tmp_path), "EPIFORGE_TEST_MARKER": marker}
    script = ("import sys\nfrom epiforge.eval import evaluate\nfrom epiforge.eval.judge_zygote import warm_judges\n"
              "warm_judges()\nevaluate('k1', sys.argv[1], timeout_s=300)\n")
    harness = subprocess.Popen([sys.executable, "-c", script, str(EXPLOITS / "infinite_loop.py")], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill_midway_and_find_nothing_left(harness, marker, tmp_path, 9, up=4)  # harness, zygote, judge, runner


SANDBOXED = "user and mount namespaces: read-only filesystem but its own dir, no network, its own PID namespace"


@pytest.mark.sandbox
def test_the_judge_and_the_repo_are_out_of_the_runners_reach(tmp_path):
    """A kernel that escapes the static rules finds no way to the judge or the disk: it may
    not read its parent's memory or environment (/proc/PPID/mem, environ: the judge is
    non-dumpable, and the runner's user namespace holds no capability outside it, root or
    not), write into the repo or the temp dir, or open a socket to the outside."""
    probe = tmp_path / "probe-written"
    kernel = tmp_path / "k1_escapes.py"
    kernel.write_text(
        '"""Tries to reach the judge and the disk."""\nimport os, socket\nTASK = "k1_gemm_rmsnorm"\n\n'
        "def run(inputs, prepared, config=None):\n"
        "    got = []\n"
        "    for what in ('environ', 'mem', 'maps'):\n"
        "        try:\n"
        "            open(f'/proc/{os.getppid()}/{what}', 'rb').read(64)\n"
        "            got.append(what)\n"
        "        except OSError:\n"
        "            pass\n"
        f"    for path in ({str(REPO / 'tasks' / 'escaped.txt')!r}, {str(probe)!r}):\n"
        "        try:\n"
        "            open(path, 'w').write('x')\n"
        "            got.append(path)\n"
        "        except OSError:\n"
        "            pass\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', 9), timeout=2)\n"
        "        got.append('socket')\n"
        "    except OSError:\n"
        "        pass\n"
        "    open('mine.txt', 'w').write('its own dir is writable')\n"
        "    raise RuntimeError(f'REACHED {got}')\n")
    r = evaluate("k1", str(kernel), seed=1, static_checks=False)
    assert r.environment.get("runner_sandbox") == SANDBOXED, r.environment
    assert r.outcome.value == "RUNTIME_ERROR" and "REACHED []" in r.message, r.message + r.stderr_tail
    assert not (REPO / "tasks" / "escaped.txt").exists() and not probe.exists()


@pytest.mark.sandbox
def test_the_runner_takes_its_own_compile_locks(tmp_path, monkeypatch):
    """The shared compile cache reaches the runner as links, read-only, except its lock and
    temp files: quack opens `{sha}.lock` for writing before it compiles a key whose object is
    missing, and a linked lock failed that open (EROFS) whenever another process had
    compiled the key (CI, 2026-12-04: an expert kernel got COMPILE_ERROR)."""
    shared = tmp_path / "shared-quack-cache"
    (shared / "fp").mkdir(parents=True)
    for name in ("key.lock", "done.o", "done.lock", "half.o.tmp.4242"):
        (shared / "fp" / name).write_text("shared")
    triton = tmp_path / "shared-triton-cache"  # Triton compiles into tmp.pid_* folders inside a key's folder
    (triton / "key" / "tmp.pid_1_2").mkdir(parents=True)
    (triton / "key" / "k.json").write_text("shared")
    kernel = tmp_path / "k1_locks.py"
    kernel.write_text(
        '"""Takes locks in the compile cache, as quack does."""\nimport os\nTASK = "k1_gemm_rmsnorm"\n\n'
        "def run(inputs, prepared, config=None):\n"
        "    fp = os.path.join(os.environ['QUACK_CACHE_DIR'], 'fp')\n"
        "    got = []\n"
        "    for name in ('key.lock', 'done.lock', 'new.lock'):\n"
        "        try:\n"
        "            os.close(os.open(os.path.join(fp, name), os.O_WRONLY | os.O_CREAT))\n"
        "            got.append(name)\n"
        "        except OSError as e:\n"
        "            got.append(f'{name}: {e.strerror}')\n"
        "    got.append(open(os.path.join(fp, 'done.o')).read())\n"
        "    got.append(str(os.path.exists(os.path.join(fp, 'half.o.tmp.4242'))))\n"
        "    key = os.path.join(os.environ['TRITON_CACHE_DIR'], 'key')\n"
        "    os.makedirs(os.path.join(key, 'tmp.pid_9_9'))\n"
        "    got.append(open(os.path.join(key, 'k.json')).read() + str(os.path.exists(os.path.join(key, 'tmp.pid_1_2'))))\n"
        "    raise RuntimeError(f'LOCKS {got}')\n")
    monkeypatch.setenv("QUACK_CACHE_DIR", str(shared))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    r = evaluate("k1", str(kernel), seed=1, static_checks=False)
    assert r.environment.get("runner_sandbox") == SANDBOXED, r.environment
    assert "LOCKS ['key.lock', 'done.lock', 'new.lock', 'shared', 'False', 'sharedFalse']" in r.message, \
        r.message + r.stderr_tail
    assert sorted(p.name for p in (shared / "fp").iterdir()) == ["done.lock", "done.o", "half.o.tmp.4242", "key.lock"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "epiforge", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_cli_eval_records_and_answers(tmp_path):
    db = tmp_path / "results.sqlite"
    out = cli("eval", "--task", "k1", "--kernel", str(EXPLOITS / "torch_matmul.py"), "--json", "--store", str(db))
    assert out.returncode == 1
    r = json.loads(out.stdout)
    assert r["outcome"] == "STATIC_REJECTED" and r["stage"] == "static" and r["violations"]
    out = cli("eval", "--task", "k1", "--kernel", str(EXPLOITS / "first_row_only.py"), "--store", str(db))
    assert out.returncode == 1 and "INCORRECT_NUMERICS" in out.stdout and "worst" in out.stdout
    from epiforge.eval.store import ResultStore

    rows = ResultStore(db).rows()
    assert [x.result.outcome.value for x in rows] == ["INCORRECT_NUMERICS", "STATIC_REJECTED"]
    bad = cli("eval", "--task", "k1", "--kernel", "human", "--shapes", "huge")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown shape set" in bad.stderr


def test_cli_eval_says_provisional_and_keeps_its_timeout(tmp_path):
    """A CPU pass reads as provisional on the CLI's own line; --timeout cuts an evaluation
    whose kernel never returns (it passes the static rules: a plain loop in run()) to a
    TIMEOUT in one line, well before the default limit."""
    ok = cli("eval", "--task", "k1", "--kernel", "human", "--seed", "5")
    assert ok.returncode == 0, ok.stderr[-2000:]
    first = " ".join(ok.stdout.split("(stage:")[0].split())  # the first line, as the console wrapped it
    assert "PASSED (provisional: CPU emulator only" in first and "hidden shapes" in first, ok.stdout
    spin = tmp_path / "k1_spins.py"
    spin.write_text('"""Never returns."""\nimport primitives as P\nTASK = "k1_gemm_rmsnorm"\n\n\n'
                    "def run(inputs, prepared, config=None):\n    n = 0\n"
                    "    for i in range(10 ** 12):\n        n = n + i\n    return {\"out\": n}\n")
    started = time.monotonic()
    out = cli("eval", "--task", "k1", "--kernel", str(spin), "--timeout", "15", "--json")
    r = json.loads(out.stdout)
    assert out.returncode == 1 and r["outcome"] == "TIMEOUT", r["message"]
    assert time.monotonic() - started < 15 + 30


def test_the_zygotes_runner_imports_leave_each_runner_its_own_temp_dir(tmp_path):
    """eval/runner.py warm_imports: torch's inductor looks the temp dir up while it
    imports (tempfile caches it); a runner forked after must still find its own TMPDIR."""
    import os
    import subprocess
    import sys

    code = ("import os, sys, tempfile; from epiforge.eval.runner import RUNNER_IMPORTS, warm_imports\n"
            "assert warm_imports() and all(m in sys.modules for m in RUNNER_IMPORTS)\n"
            "os.environ['TMPDIR'] = sys.argv[1]; print(tempfile.gettempdir())")
    first, mine = tmp_path / "first", tmp_path / "mine"
    first.mkdir(), mine.mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(mine)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(first)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(mine)
