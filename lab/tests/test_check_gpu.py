"""On a Hopper GPU: the expert track passes at the smoke shapes with exactly the allowed
launches (lab/bench/check_gpu.py), and one kernel through the isolated evaluator."""

import json

import pytest

pytestmark = pytest.mark.gpu


def test_expert_kernels_pass_with_allowed_launches(tmp_path):
    from lab.bench import check_gpu

    out = tmp_path / "check.json"
    rc = check_gpu.main(["--shapes", "smoke", "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["all_passed"]
    assert {r["task"] for r in report["rows"]} and all(r["outcome"] == "PASSED" for r in report["rows"])
    assert all(r["launches_ok"] for r in report["rows"] if "launches_ok" in r)


def test_isolated_evaluator_on_the_gpu():
    from epiforge.eval import evaluate

    r = evaluate("k1", "human", device="gpu", shapes="smoke", seed=5)
    assert r.outcome.value == "PASSED", r.message + r.stderr_tail
