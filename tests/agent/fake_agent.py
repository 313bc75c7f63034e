"""A scripted stand-in for a coding-agent CLI, for the command backend's tests: run in the
prepared workspace, it behaves like an agent that gets k1 wrong once and then right.

    fake_agent.py [--no-check] [--hang] [--right-first]

Round 0 (no FEEDBACK.md): writes a kernel with a 2% scale error (--hang: one whose run()
never returns; --right-first: the correct one, so the session passes at once) and runs ./check.
Round 1 (FEEDBACK.md names the failure): writes the correct kernel.
"""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenarios import K1_GOOD, K1_HANGS, K1_OFF_BY_2PCT  # noqa: E402

prompt = sys.stdin.read()
feedback = Path("FEEDBACK.md")
if not feedback.exists():
    assert "k1_gemm_rmsnorm" in prompt and Path("check").exists() and Path("docs").is_dir(), "workspace not prepared"
    Path("kernel.py").write_text(K1_HANGS if "--hang" in sys.argv else K1_GOOD if "--right-first" in sys.argv
                                 else K1_OFF_BY_2PCT)
    print("fake agent: wrote a first kernel")
    if "--no-check" not in sys.argv:
        out = subprocess.run(["./check", "--no-compile"], capture_output=True, text=True)
        print(out.stdout)
elif "INCORRECT_NUMERICS" in feedback.read_text():
    Path("kernel.py").write_text(K1_GOOD)
    print("fake agent: the scale was off; fixed")
else:
    print("fake agent: nothing to do")
