"""training/loss_curve.py: a few steps at a tiny size on the CPU (the emulator) write the
JSON and the PNG; the fields are there, and the deviation is the one the two curves give."""

import json

from training.loss_curve import main

TINY = ["--steps", "3", "--batch", "2", "--seq", "16", "--vocab", "64", "--layers", "2", "--d", "128",
        "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--ffn", "256", "--seed", "7"]


def test_a_few_tiny_steps_write_both_curves_and_their_deviation(tmp_path):
    main([*TINY, "--out", str(tmp_path)])
    report = json.loads((tmp_path / "loss_curve_cpu.json").read_text())
    assert (tmp_path / "loss_curve_cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fused, ref = report["curves"]["fused"], report["curves"]["reference"]
    assert len(fused) == len(ref) == report["training"]["steps"] == 3
    assert all(f == f and r == r for f, r in zip(fused, ref))  # no NaN
    assert fused != ref  # two runs, not one copied
    gaps = [abs(f - r) for f, r in zip(fused, ref)]
    assert report["deviation"]["max_abs"] == max(gaps)
    assert report["deviation"]["mean_abs"] == sum(gaps) / len(gaps)
    assert report["deviation"]["max_abs_step"] == 1 + gaps.index(max(gaps))
    assert report["deviation"]["final_fused"] == fused[-1] and report["deviation"]["final_reference"] == ref[-1]
    assert report["device"] == "cpu" and "emulator" in report["note"]
    assert report["model"]["parameters"] > 0 and report["model"]["n_layers"] == 2 and report["model"]["vocab"] == 64
    assert report["training"]["lr"] == 1e-3 and report["training"]["seed"] == 7
    env = report["environment"]
    assert {"torch", "date", "command", "commit"} <= env.keys()
    assert env["command"].startswith("python -m training.loss_curve --steps 3")
    assert str(tmp_path) in env["command"]  # the command as run (no $OUT set)
    assert isinstance(report["uncommitted_tracked_files"], list)
    assert 0 < report["data"]["entropy_rate_nats"] < report["data"]["uniform_loss_nats"]
