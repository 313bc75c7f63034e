"""conftest.py's `spawns` rule: a test that starts a process without the marker fails,
naming the marker; with it, or starting none, it passes; the record mode lists the spawners."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawns  # it runs pytest

REPO = Path(__file__).resolve().parents[1]


def test_a_test_that_starts_a_process_needs_the_spawns_marker(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EPIFORGE_TEST_SPAWNS_RECORD"}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "tests/spawn_marker_cases.py", "-rA"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "started a process (in its call) and carries no `spawns` marker" in out.stdout
    assert "ERROR tests/spawn_marker_cases.py::test_starts_a_process_unmarked" in out.stdout
    assert "PASSED tests/spawn_marker_cases.py::test_starts_a_process_marked" in out.stdout
    assert "PASSED tests/spawn_marker_cases.py::test_starts_none" in out.stdout
    record = tmp_path / "spawns.txt"
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env={**env, "EPIFORGE_TEST_SPAWNS_RECORD": str(record)},
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    assert sorted(line.split("\t")[0].split("::")[1] for line in record.read_text().splitlines()) == [
        "test_starts_a_process_marked", "test_starts_a_process_unmarked"]
