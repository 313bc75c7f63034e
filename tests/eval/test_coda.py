"""The `coda` baseline (eval/coda.py, eval/coda_worker.py) without a GPU: when it is left out
and why, its worker's import path, and each mapping's conventions. The conventions are
checked against the task's own reference with CODA's arithmetic as its kernels do it, read
from coda-kernels 0.2's source (coda/core/epilogue/activation.py RoPE.visit: pairs (2i, 2i+1),
angle pos * freq[2i], (x, y) -> (x c + y s, y c - x s); coda/core/elementwise/rope.py:
per-head rms = rsqrt(sum of squares / head_dim + eps), gamma by column within the head,
freq by pair index within the slice). On a GPU, the judge checks CODA's real outputs the same
way before it times them (tests/eval/test_gpu_coda.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from epiforge.eval import channel
from epiforge.eval.baselines import REGISTRY
from epiforge.eval.coda import ENV_VAR, CodaBaseline, CodaUnavailable, rounded_check, worker_path
from epiforge.eval.coda_worker import CONVENTIONS, ROUNDED, _Mapping
from epiforge.tasks import get_task, load_catalogue
from epiforge.tasks.spec import load_shape_sets
from epiforge.tasks.tolerance import check_output


def test_the_registry_names_exactly_the_mapped_tasks_and_each_is_a_task():
    ids = {t.id for t in load_catalogue()[0]}
    assert set(CONVENTIONS) <= ids
    assert sorted(REGISTRY["coda"].tasks.split()) == sorted(CONVENTIONS)


@pytest.mark.parametrize("task, device, env, why", [
    ("k1", "cuda", None, "CODA has no kernel for this task"),
    ("k8", "cpu", None, "CODA's kernels need a CUDA GPU"),
    ("k8", "cuda", None, f"set {ENV_VAR}"),
    ("k8", "cuda", "empty", "holds no coda-kernels"),
])
def test_left_out_with_one_line_saying_why(task, device, env, why, tmp_path, monkeypatch):
    if env is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(CodaUnavailable) as e:
        CodaBaseline(get_task(task), {}, [], device)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_the_worker_imports_codas_cute_dsl_and_quack_before_ours(tmp_path):
    ours = ["/repo", "/x/site-packages/nvidia_cutlass_dsl/dsl_packages", "/x/site-packages", ""]
    path = worker_path(tmp_path, ours)
    assert path[:2] == [str(tmp_path / "nvidia_cutlass_dsl" / "dsl_packages"), str(tmp_path)]
    assert path[2:] == ["/repo", "/x/site-packages"]  # our CuTe DSL's packages folder is gone


def _start_worker(env_dir: Path):
    """The worker as the judge starts it (eval/coda.py), with CODA's environment `env_dir`:
    (its process, this side's socket)."""
    import socket

    mine, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(worker_path(env_dir, sys.path))}
    proc = subprocess.Popen([sys.executable, "-m", "epiforge.eval.coda_worker", str(theirs.fileno()),
                             str(os.getpid())], pass_fds=(theirs.fileno(),), env=env, stderr=subprocess.DEVNULL)
    theirs.close()
    return proc, mine


@pytest.mark.spawns
def test_a_worker_whose_coda_does_not_import_says_so_in_one_line(tmp_path):
    """The worker itself, started as the judge starts it, with an environment lacking CODA."""
    proc, mine = _start_worker(tmp_path)
    try:
        msg, _ = channel.receive(mine, deadline=None)
    finally:
        assert proc.wait(timeout=60) == 2
        mine.close()
    assert msg["error"].startswith("CODA does not import: ModuleNotFoundError") and msg["versions"]["coda-kernels"] is None


#: CODA's environment: EPIFORGE_CODA_ENV, else the one .ci/setup-venv installs
CODA_ENV = os.environ.get(ENV_VAR) or str(Path(__file__).resolve().parents[2] / ".venv" / "coda")


@pytest.mark.spawns
@pytest.mark.skipif(not (Path(CODA_ENV) / "coda").is_dir(),
                    reason=f"CODA's environment is not installed ({ENV_VAR}, or .ci/setup-venv's .venv/coda)")
def test_the_worker_imports_codas_own_quack_beside_ours():
    """The worker started as the judge starts it, with CODA's real environment: it imports
    coda-kernels with the quack and CuTe DSL CODA pins, while this process has ours."""
    import quack

    proc, mine = _start_worker(Path(CODA_ENV))
    try:
        hello, _ = channel.receive(mine, deadline=None)
        channel.send(mine, {"op": "close"})
        assert channel.receive(mine, deadline=None)[0] == {"ok": True}
    finally:
        assert proc.wait(timeout=60) == 0
        mine.close()
    assert hello["versions"]["coda-kernels"] == "0.2" and hello["versions"]["quack-kernels"] == "0.6.1"
    assert hello["versions"]["nvidia-cutlass-dsl"] == "4.6.0" and quack.__version__ == "0.6.5"


# ---- the conventions, with CODA's arithmetic in torch ------------------------------------------


def _coda_rotate(d: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """CODA's rotation of adjacent pairs by its angle: (x, y) -> (x c + y s, y c - x s)."""
    x, y = d[:, 0::2], d[:, 1::2]
    c, s = torch.cos(angle), torch.sin(angle)
    out = torch.empty_like(d)
    out[:, 0::2], out[:, 1::2] = x * c + y * s, y * c - x * s
    return out


def _inputs(task_id: str):
    task = get_task(task_id)
    dims = load_shape_sets()["smoke"][0].dims()
    return task, dims, task.make_inputs(dims, seed=3)


def _agrees(task, dims, inputs, got: dict) -> None:
    exact = task.reference(inputs, dims, exact=True)
    lowprec = task.reference(inputs, dims, exact=False, rounded=False)
    for o in task.outputs:
        check = check_output(o, got[o.name].to(o.torch_dtype), exact[o.name], lowprec[o.name])
        assert check.ok, check.detail


@pytest.mark.parametrize("task_id", ["k3", "k3hf"])
def test_gemm_rope_with_our_frequency_table_is_the_task(task_id):
    task, dims, x = _inputs(task_id)
    m = _Mapping(task_id, x, dims, {})
    acc = x["a"].float() @ x["w_qkv"].float().T
    got = _coda_rotate(acc, x["positions"].float()[:, None] * m.freq[0::2][None, :])
    _agrees(task, dims, x, {"qkv": got})


def test_the_other_direction_is_not_the_task():
    """The check above can fail: k3's table on k3hf's task (the rotation's sign) is rejected."""
    task, dims, x = _inputs("k3hf")
    m = _Mapping("k3", x, dims, {})
    acc = x["a"].float() @ x["w_qkv"].float().T
    got = _coda_rotate(acc, x["positions"].float()[:, None] * m.freq[0::2][None, :])
    with pytest.raises(AssertionError):
        _agrees(task, dims, x, {"qkv": got})


def _coda_qkn(x, dims, freq_sign: float = 1.0, pre_dtype=torch.float32) -> torch.Tensor:
    """CODA's qkn as our mapping calls it: per-head sums of squares of the accumulator, the
    pre-activation stored in pre_dtype and read back, normalized, rotated, once per half."""
    m = _Mapping("qkn", x, dims, {"eps": 1e-6})
    m.before()
    d, hd = dims["d"], dims["head_dim"]
    acc = x["a"].float() @ x["w_qk"].float().T
    pre = acc.to(pre_dtype).float()
    out = torch.empty_like(pre)
    for half, gamma in ((0, x["q_norm_weight"]), (1, x["k_norm_weight"])):
        cols = slice(half * d, (half + 1) * d)
        ssq = acc[:, cols].reshape(acc.shape[0], -1, hd).pow(2).sum(-1, keepdim=True)
        heads = pre[:, cols].reshape(pre.shape[0], -1, hd)
        normed = (heads * gamma.float() * torch.rsqrt(ssq / hd + 1e-6)).reshape(pre.shape[0], d)
        angle = m.int32["positions"].float()[:, None] * (freq_sign * m.freq)[None, :]
        out[:, cols] = _coda_rotate(normed, angle)
    return out


def test_qknorm_rope_once_per_half_with_our_tables_is_the_task():
    task, dims, x = _inputs("qkn")
    _agrees(task, dims, x, {"qk": _coda_qkn(x, dims)})


def test_codas_rounded_intermediates_pass_the_rms_bound_and_a_wrong_mapping_does_not():
    """eval/coda.py ROUNDED: qkn from the stored 16-bit pre-activation, and k9's loss from the
    rounded target logit, are within ROUNDED_RMS of the task's reference; the rotation's
    wrong sign, a wrong norm weight, a 2 % scale or a NaN are not."""
    task, dims, x = _inputs("qkn")
    exact = task.reference(x, dims, exact=True)["qk"]
    assert rounded_check(_coda_qkn(x, dims, pre_dtype=torch.bfloat16), exact)[0]
    assert not rounded_check(_coda_qkn(x, dims, freq_sign=-1.0), exact)[0]
    swapped = {**x, "q_norm_weight": x["k_norm_weight"], "k_norm_weight": x["q_norm_weight"]}
    assert not rounded_check(_coda_qkn(swapped, dims), exact)[0]
    assert not rounded_check(exact * 1.02, exact)[0]
    assert not rounded_check(torch.where(exact > 2, float("nan"), exact), exact)[0]
    task, dims, x = _inputs("k9")
    ref = task.reference(x, dims, exact=True)
    logits = x["a"].double() @ x["w_lm"].double().T
    target = logits.gather(1, x["targets"][:, None]).squeeze(1)
    ok, text = rounded_check(ref["lse"].double() - target.to(torch.bfloat16).double(), ref["loss"])
    assert ok and "max error" in text
    assert set(ROUNDED) <= set(CONVENTIONS)


def test_swiglu_pairs_adjacent_columns():
    task, dims, x = _inputs("k8")
    z = x["a"].float() @ x["w_gu"].float().T
    gate, up = z[:, 0::2], z[:, 1::2]  # CODA's Gated epilogue: fn(D[2i], D[2i+1])
    _agrees(task, dims, x, {"z": z, "out": torch.nn.functional.silu(gate) * up})
