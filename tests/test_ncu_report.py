"""bench/ncu_report.py reads Nsight Compute's CSV output (as bench/h200.sh profile collects
it) and sets each run beside the plain GEMM of its task."""

import pytest

from epiforge.bench import ncu_report

VALUES = {"gemm": ("550,000", "200,000,000", "100,000,000", "15.00", "96.00"),
          "fused": ("660,000", "500,000,000", "400,000,000", "38.70", "82.40")}


def _ncu_text(runs=("gemm", "fused"), drop=None):
    lines = []
    for what in runs:
        lines.append(f"==> /tmp/epiforge-h200/ncu-k7-1B-{what}.csv <==")
        for metric, value in zip(ncu_report.METRICS, VALUES[what]):
            if metric == drop and what == "fused":
                continue
            lines.append(",".join(f'"{x}"' for x in ["0", "757", "python3.12", "127.0.0.1", f"kernel_cutlass_{what}", "1",
                                                      "7", "(384, 1, 1)", "(1, 2, 66)", "0", "9.0",
                                                      "Command line profiler metrics", metric, "ns", value]))
    return "\n".join(lines) + "\n"


def test_runs_are_set_beside_the_plain_gemm():
    rows = {r["what"]: r for r in ncu_report.compare(ncu_report.parse(_ncu_text()))}
    fused = rows["fused"]
    assert fused["kernel"] == "kernel_cutlass_fused" and fused["gpu__time_duration.sum"] == 660000.0
    assert fused["time_over_gemm"] == pytest.approx(1.2) and fused["dram_bytes_over_gemm"] == pytest.approx(3.0)
    assert rows["gemm"]["time_over_gemm"] == 1.0
    table = ncu_report.markdown(list(rows.values()))
    assert "| k7 | 1B | fused | 1.200 | 500 | 400 | 38.7 | 82.4 |" in table


def test_a_run_without_its_metrics_is_an_error_not_a_row():
    with pytest.raises(ValueError, match="k7 1B fused"):
        ncu_report.parse(_ncu_text(drop="dram__bytes_read.sum"))
    with pytest.raises(ValueError, match="no ncu runs"):
        ncu_report.parse("==PROF== Error: ERR_NVGPUCTRPERM\n")  # ncu could not profile at all


def test_cli_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ncu_report.main([str(tmp_path / "none.txt"), "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "none.txt" in capsys.readouterr().err
