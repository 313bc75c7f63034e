"""The command backend's sandbox (agent/sandbox.py, issue 43 point 2): an agent command that
tries to read the expert kernels, the repository, the store or the home fails to; it can
write its workspace and nothing else that outlives it; ./check still runs there."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from epiforge import IMPORT_ROOT, ROOT
from epiforge.agent.sandbox import CANNOT, available

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

SANDBOX, WHY_NOT = available()
#: a machine whose kernel lacks unprivileged user namespaces or Linux 5.12's mount API cannot
#: run the sandbox at all (the product then stops in one line: the last test here)
needs_sandbox = pytest.mark.skipif(not SANDBOX, reason=f"the agent's sandbox cannot be set up here: {WHY_NOT}")

PROBE = r"""
import json, os, sys
from pathlib import Path
root, store, home = sys.argv[1:4]
def readable(p):
    try:
        Path(p).read_bytes() if Path(p).is_file() else os.listdir(p)
        return True
    except OSError:
        return False
def writable(p):
    try:
        Path(p).write_text("x")
        return True
    except OSError:
        return False
import epiforge.eval.evaluation  # the package, as ./check imports it
print(json.dumps({
    "expert": readable(f"{root}/human_kernels/k1_gemm_rmsnorm.py"),
    "expert_relative": readable("../human_kernels"),
    "tests": readable(f"{root}/tests"),
    "readme": readable(f"{root}/README.md"),
    "git": readable(f"{root}/.git"),
    "results": readable(f"{root}/lab/results"),
    "store": readable(f"{store}/store.sqlite"),
    "home": readable(f"{home}/.secret"),
    "package": readable(f"{root}/eval/judge.py"),
    "workspace": writable("kernel.py"),
    "repo_write": writable(f"{root}/tasks/evil.py"),
}))
"""


def _probe(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    ws, store, home = tmp_path / "ws", tmp_path / "store", tmp_path / "home"
    for d in (ws, store, home):
        d.mkdir()
    (store / "store.sqlite").write_text("results")
    (home / ".secret").write_text("a key")
    (ws / "probe.py").write_text(PROBE)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "EPIFORGE_DATA_DIR": str(store),
           "PYTHONPATH": str(IMPORT_ROOT)}
    return subprocess.run([sys.executable, "-m", "epiforge.agent.sandbox", "--workspace", str(ws), *extra, "--",
                           sys.executable, "probe.py", str(ROOT), str(store), str(home)],
                          cwd=ws, env=env, capture_output=True, text=True, timeout=120)


@needs_sandbox
def test_the_agent_sees_its_workspace_and_the_package_and_nothing_else(tmp_path):
    run = _probe(tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"expert": False, "expert_relative": False, "tests": False, "readme": False, "git": False,
                    "results": False, "store": False, "home": False, "package": True, "workspace": True,
                    "repo_write": False}
    assert (tmp_path / "ws" / "kernel.py").read_text() == "x"  # the workspace is the real one
    assert not (Path(ROOT) / "tasks" / "evil.py").exists()


@needs_sandbox
def test_a_path_the_user_exposes_is_readable_and_stays_read_only(tmp_path):
    tools = Path(ROOT) / "tests" / "agent"  # hidden by default (tests/), exposed by name
    ws = tmp_path / "ws"
    ws.mkdir()
    run = subprocess.run([sys.executable, "-m", "epiforge.agent.sandbox", "--workspace", str(ws), "--expose", str(tools),
                          "--", "sh", "-c", f"head -c 3 {tools}/fake_agent.py; touch {tools}/x 2>/dev/null || echo ro; "
                          f"ls {Path(ROOT) / 'tests'}"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ['"""ro', "agent"], run.stdout  # tests/ shows only what was exposed
    assert not (tools / "x").exists()


def test_a_sandbox_that_cannot_be_set_up_is_one_line_and_exit_126(tmp_path):
    run = subprocess.run([sys.executable, "-m", "epiforge.agent.sandbox", "--workspace", str(tmp_path / "none"), "--",
                          "true"], capture_output=True, text=True, timeout=60)
    assert run.returncode == CANNOT and "Traceback" not in run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"sandbox: the workspace {tmp_path / 'none'} is not a directory") and "--no-sandbox" in line


@needs_sandbox
def test_check_runs_in_the_sandbox(tmp_path):
    """./check (the judge and its own sandboxed runner, nested) works inside the agent's
    sandbox, with the expert kernels out of sight."""
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(Path(ROOT) / "human_kernels" / "k1_gemm_rmsnorm.py", ws / "kernel.py")
    run = subprocess.run([sys.executable, "-m", "epiforge.agent.sandbox", "--workspace", str(ws), "--",
                          sys.executable, "-m", "epiforge.agent.check", "--task", "k1", "--no-compile", "--dtype", "bf16"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "PASSED" in run.stdout, run.stdout[-1500:] + run.stderr[-1500:]
