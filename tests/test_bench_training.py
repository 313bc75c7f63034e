"""bench/training.py: the layer and training-step benchmark runs end to end at toy sizes on
the CPU (the fused ops through the emulator), and its contenders compute the same function;
on a GPU, the Liger contenders do too."""

import json

import pytest
import torch

from epiforge.bench import training as bt


def test_tiny_run_writes_a_report_whose_contenders_agree(tmp_path):
    out = tmp_path / "training.json"
    assert bt.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    report = bt.Report.model_validate(json.loads(out.read_text()))
    assert [r.part for r in report.rows] == ["layer", "step"]
    assert report.environment["commit"] and "bench.training" in report.environment["command"]
    for row in report.rows:
        by_name = {c.name: c for c in row.contenders}
        want = {"fused", "fused-eager-glue", "eager"} | ({"fused-stored-logits"} if row.part == "step" else set())
        assert set(by_name) == want, by_name
        assert all(c.error is None and c.loss is not None for c in row.contenders), row.contenders
        fused, eager = by_name["fused"].loss, by_name["eager"].loss
        # the same weights and inputs: bf16 pipelines that differ in rounding, not in math
        assert abs(fused - eager) <= 0.01 * abs(eager), (row.part, fused, eager)
        if row.part == "step":  # k5l's loss is k5's: both from the unrounded float32 logits
            assert abs(by_name["fused-stored-logits"].loss - fused) <= 1e-6 * abs(fused), row.contenders
        assert row.reps == 0 and not row.ratios and all(c.timing is None for c in row.contenders), "a CPU time reported"


def test_a_cpu_run_without_tiny_is_refused(tmp_path, capsys):
    assert bt.main(["--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert "only --tiny" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.gpu
def test_the_liger_layer_computes_the_reference_layer():
    if bt._liger() is None:
        pytest.skip("liger_kernel is not installed")
    cfg = bt.LAYERS[2048]
    torch.manual_seed(0)
    ref = bt.ReferenceLlamaLayer(cfg, torch.float32, device="cuda")
    liger = bt.LigerLlamaLayer(cfg, {k: v.bfloat16() for k, v in ref.to_hf_state_dict().items()})
    x = torch.randn(2, 256, cfg.d, device="cuda")
    want = ref(x)
    got = liger(x.bfloat16()).float()
    rel = (got - want).norm() / want.norm()
    assert rel < 0.02, rel


def test_the_report_renders_the_committed_h200_step_with_its_ratios(capsys):
    """--report on the committed H200 step file: every contender, its time over the fused
    one's as the file's paired ratio (not a ratio of medians), the kernel breakdown."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench/results/h200/training/step.json"
    report = bt.Report.model_validate_json(path.read_text())
    assert bt.main(["--report", str(path)]) == 0
    text = capsys.readouterr().out
    row = report.rows[0]
    for k in row.contenders:
        assert f"| {k.name} |" in text
    r = row.ratios["compile/fused"]
    assert f"{r.median:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" in text
    assert "| contender | attention | gemm | optimizer | rest | total |" in text


def test_report_of_a_missing_file_is_one_line(tmp_path, capsys):
    assert bt.main(["--report", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.training:") and err.count("\n") == 1
