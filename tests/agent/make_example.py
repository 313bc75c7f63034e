"""Record the example session shipped in logs/examples/ (run by hand, not by pytest):

    .venv/bin/python tests/agent/make_example.py

A real session of the anthropic backend (the official SDK, streaming, tools, caching)
against the loopback Messages server in loopback.py, answered by the scripted model
scenarios.k8_example(): no LLM is involved, and the log says so (model
"scripted-loopback-server"). The kernels are checked with the sm_90a cross-compile, as in a
default session. The passing kernel goes to generated_kernels/, the committed track (named
here, as `--out generated_kernels` names it for any session).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(HERE), str(REPO)]

from loopback import Loopback  # noqa: E402
from scenarios import k8_example  # noqa: E402

from epiforge.agent.backends import RetryPolicy, make_backend  # noqa: E402
from epiforge.agent.loop import run_session  # noqa: E402
from epiforge.agent.session import Budget, SessionConfig  # noqa: E402
from epiforge.eval.machine import GENERATED_DIR  # noqa: E402

EXAMPLE = REPO / "logs" / "examples" / "k8_gemm_swiglu.anthropic.scripted-loopback.jsonl"


def main() -> int:
    if EXAMPLE.exists():
        print(f"{EXAMPLE} exists; a log is never overwritten (move it away to re-record)")
        return 1
    os.environ["ANTHROPIC_API_KEY"] = "loopback-needs-no-key"  # the SDK wants one; the loopback ignores it
    with Loopback("anthropic", k8_example()) as server, tempfile.TemporaryDirectory() as ws:
        backend = make_backend("anthropic", model="scripted-loopback-server", base_url=server.url,
                               retry=RetryPolicy(backoff_s=0.1), timeout_s=60)
        config = SessionConfig(task="k8", backend="anthropic", model="scripted-loopback-server", base_url=server.url,
                               budget=Budget(max_turns=10), compile=True, device="cpu")
        end, log = run_session(config, backend, log_path=EXAMPLE, workspace=Path(ws), out_dir=GENERATED_DIR)
    print(end.outcome, log)
    return 0 if end.outcome == "passed" else 1


if __name__ == "__main__":
    sys.exit(main())
