"""The eval command's own checks, before any judging: the store, the device, the shape set's
size on the CPU, and the kernel's name."""

import subprocess
import sys
from pathlib import Path

import pytest

from epiforge.eval.machine import hopper_available

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REPO = Path(__file__).resolve().parents[2]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "epiforge", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def test_eval_opens_its_store_before_it_judges(tmp_path):
    """A --store that cannot be used is refused before the evaluation: with a kernel file that
    does not exist, the store's error comes first (the judge never started)."""
    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database\n")
    out = _cli("eval", "--task", "k0", "--kernel", str(tmp_path / "absent.py"), "--store", str(garbage))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot open the results store" in out.stderr and "absent.py" not in out.stderr
    assert garbage.read_text() == "not a database\n" and not out.stdout


@pytest.mark.skipif(hopper_available(), reason="needs a machine without a Hopper GPU")
def test_device_gpu_without_a_gpu_is_one_line_and_stores_nothing(tmp_path):
    """--device gpu where there is no Hopper GPU is the flag's error, not the kernel's:
    before, the judge failed at its first CUDA call and stored RUNTIME_ERROR against the expert."""
    store = tmp_path / "r.sqlite"
    for args in (("eval", "--task", "k0", "--kernel", "human", "--device", "gpu", "--store", str(store)),
                 ("compare", "--task", "k0", "--device", "gpu", "--store", str(store))):
        out = _cli(*args)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (args, out.stderr)
        assert out.stderr.startswith("epiforge: --device gpu: ") and "--device cpu" in out.stderr
        assert not out.stdout and not store.exists()


def test_eval_says_before_the_wait_that_the_paper_shapes_are_large_for_the_cpu(tmp_path):
    """The paper's shapes run at full size on the emulator: the note comes first, with the
    GEMM work from the task's own shapes (k0: 2 m n k at 1B, 7B and 70B)."""
    from epiforge import tasks

    rows = tasks.shape_sets()["paper"]
    tflop = sum(2 * r.M * r.d * r.d for r in rows) / 1e12  # k0: x = a @ w_o^T, a (M, d), w_o (d, d)
    out = _cli("eval", "--task", "k0", "--kernel", "human", "--shapes", "paper", "--timeout", "3")
    note = out.stderr.splitlines()[0]
    assert note.startswith(f"epiforge: note: --shapes paper on the CPU emulator is {tflop:.1f} TFLOP") and "(3 s)" in note
    assert out.returncode == 1 and "TIMEOUT" in out.stdout
    small = _cli("eval", "--task", "k0", "--kernel", "human", "--shapes", "smoke", "--json")
    assert small.returncode == 0 and "note:" not in small.stderr



def test_expert_names_the_expert_kernel_as_compare_does(tmp_path):
    import hashlib
    import json

    out = _cli("eval", "--task", "k1", "--kernel", "expert", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    want = hashlib.sha256((REPO / "human_kernels" / "k1_gemm_rmsnorm.py").read_bytes()).hexdigest()
    assert result["track"] == "expert" and result["kernel_sha256"] == want and result["outcome"] == "PASSED"
