"""eval/warm.py: every task's baselines built ahead of a GPU comparison, in processes of
the judge's environment; a task that cannot be warmed says why in one line."""

from epiforge.eval.warm import warm_all

import pytest

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)


def test_each_task_is_warmed_in_its_own_process_and_a_bad_one_says_why():
    seen = []
    out = warm_all(["k1", "no_such_task"], "smoke", [], device="cpu", jobs=2,
                   on_done=lambda name, line: seen.append(name))
    assert out["k1"] == "ok"
    assert "no_such_task" in out["no_such_task"] and "\n" not in out["no_such_task"]
    assert sorted(seen) == ["k1", "no_such_task"]


def test_a_task_not_warmed_in_time_is_stopped():
    out = warm_all(["k1"], "smoke", ["torch_compile"], device="cpu", timeout_s=1.0)
    assert out == {"k1": "not warmed in 1 s"}
