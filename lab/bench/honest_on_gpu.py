"""Every honest kernel (tests/eval/honest_kernels) and committed generated kernel through the
judge on the GPU, numerics and launches only, one verdict a line as each comes (the
gpu-marked test in tests/eval/test_launcher.py asserts the same, but says nothing until its
end). The first line is the machine's fingerprint.

    python -m lab.bench.honest_on_gpu > honest-gpu.log
"""

import json
import time
from pathlib import Path

from epiforge.eval import evaluate
from epiforge.eval.kernel import REPO, read_kernel
from epiforge.eval.machine import fingerprint


def main() -> None:
    print("environment: " + json.dumps(fingerprint("cuda", "python -m lab.bench.honest_on_gpu")), flush=True)
    paths = sorted((REPO / "tests" / "eval" / "honest_kernels").glob("*.py")) + sorted(
        (REPO / "generated_kernels").glob("*/*.py"))
    for p in paths:
        t0 = time.time()
        r = evaluate(read_kernel(p).task, str(p), device="gpu", shapes="smoke", seed=8, launcher=True, timing=False)
        print(f"{p.stem}: {r.outcome.value} ({time.time() - t0:.0f} s) {r.message[:200]}", flush=True)


if __name__ == "__main__":
    main()
