"""training/loss_curve.py: a few steps at a tiny size on the CPU (the emulator) write the
JSON and the PNG; the fields are there, and each deviation is the one its two curves give."""

import json

from epiforge.training.loss_curve import main

import pytest

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

TINY = ["--steps", "3", "--batch", "2", "--seq", "16", "--vocab", "64", "--layers", "2", "--d", "128",
        "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--ffn", "256", "--seed", "7"]


def test_a_few_tiny_steps_write_both_curves_and_their_deviation(tmp_path):
    main([*TINY, "--out", str(tmp_path)])
    report = json.loads((tmp_path / "loss_curve_cpu.json").read_text())
    assert (tmp_path / "loss_curve_cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = report["curves"]
    fused, ref, ref_bf16w = curves["fused"], curves["reference"], curves["reference_bf16_weights"]
    assert len(fused) == len(ref) == len(ref_bf16w) == report["training"]["steps"] == 3
    assert all(x == x for x in fused + ref + ref_bf16w)  # no NaN
    assert fused != ref and ref != ref_bf16w and fused != ref_bf16w  # three runs, not one copied
    for key, (a, b) in {"deviation": (fused, ref), "deviation_fused_vs_reference_bf16_weights": (fused, ref_bf16w),
                        "deviation_reference_bf16_weights_vs_reference": (ref_bf16w, ref)}.items():
        gaps = [abs(x - y) for x, y in zip(a, b)]
        assert report[key]["max_abs"] == max(gaps), key
        assert report[key]["mean_abs"] == sum(gaps) / len(gaps), key
        assert report[key]["max_abs_step"] == 1 + gaps.index(max(gaps)), key
    assert report["deviation"]["final_fused"] == fused[-1] and report["deviation"]["final_reference"] == ref[-1]
    assert report["device"] == "cpu" and "emulator" in report["note"]
    assert report["model"]["parameters"] > 0 and report["model"]["n_layers"] == 2 and report["model"]["vocab"] == 64
    assert report["training"]["lr"] == 1e-3 and report["training"]["seed"] == 7
    env = report["environment"]
    assert {"torch", "date", "command", "commit"} <= env.keys()
    assert env["command"].startswith("python -m epiforge.training.loss_curve --steps 3")
    assert str(tmp_path) in env["command"]  # the command as run (no $OUT set)
    assert isinstance(report["uncommitted_tracked_files"], list)
    assert 0 < report["data"]["entropy_rate_nats"] < report["data"]["uniform_loss_nats"]
