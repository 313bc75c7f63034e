"""The `coda` baseline on a Hopper GPU (marker `gpu`), with CODA's environment named by
EPIFORGE_CODA_ENV (`python -m epiforge.eval.coda install DIR`; skipped without it).

Every mapped task's expert is compared with the coda baseline at the smoke shapes: the judge
checked CODA's outputs against the task's reference before timing them (a mapping that
computes something else is left out, and this test fails), and CODA's calls were timed in
the same interleaved run as the expert's."""

import os

import pytest

from epiforge.eval.coda import ENV_VAR
from epiforge.eval.coda_worker import CONVENTIONS
from epiforge.eval.compare import compare_all
from epiforge.eval.machine import expert_kernel
from epiforge.tasks import get_task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not os.environ.get(ENV_VAR), reason=f"{ENV_VAR} is not set")]


def test_coda_is_checked_and_timed_beside_every_mapped_task():
    plans = [(get_task(t).name, [("expert", expert_kernel(get_task(t).name))]) for t in CONVENTIONS]
    for cmp in compare_all(plans, device="gpu", shapes="smoke", seed=5, reps=10, baselines=["coda"], dtype="bfloat16"):
        r = cmp.results[0]
        assert r.passed, f"{cmp.task}: {r.stage}: {r.message}"
        for s in [s for s in r.per_shape if s.timing is not None]:
            note = s.timing.notes.get("coda", "")
            assert "coda" in s.timing.baselines, f"{cmp.task} {s.shape}: {note}"
            assert "coda-kernels 0.2" in note and "quack-kernels 0.6.1" in note
            assert s.timing.baselines["coda"].n == 10 and s.timing.baselines["coda"].median_us > 0
