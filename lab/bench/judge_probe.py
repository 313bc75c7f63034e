"""A first look at the evaluator on a new GPU machine, before a long run: what the
runner's sandbox achieved, that tensors cross between the judge and the runner (CUDA IPC
both ways: the NaN-poisoned buffers an empty-returning kernel leaves), and one expert
kernel end to end with its timing.

    python -m lab.bench.judge_probe
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from epiforge.eval.machine import REPO



def main() -> int:
    from epiforge.eval import evaluate

    ok = True
    for kernel, want, kw in ((REPO / "tests/exploits/fake_stdout.py", "INCORRECT_NUMERICS", {}),
                             ("human", "PASSED", {"reps": 10})):
        t0 = time.monotonic()
        r = evaluate("k1", str(kernel), device="gpu", shapes="smoke", seed=11, **kw)
        took = time.monotonic() - t0
        ok &= r.outcome.value == want
        print(f"{Path(str(kernel)).name}: {r.outcome.value} (want {want}) in {took:.1f} s ({r.stage}): {r.message[:300]}")
        print(f"  sandbox: {r.environment.get('runner_sandbox')}; gpu: {r.environment.get('gpu')}")
        for s in r.per_shape:
            if s.timing:
                t = s.timing
                over = t.fused_over_gemm_only
                print(f"  {s.shape}: kernel {t.kernel.median_us:.1f} us, {over.median:.3f}x GEMM-only "
                      f"(95% {over.ci_low:.3f}-{over.ci_high:.3f}), wall check {t.wall_check}")
        if r.outcome.value != want:
            print(r.stderr_tail[-3000:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
