"""lab/bench/ncu_report.py reads Nsight Compute's CSV output (as lab/bench/h200.sh profile collects
it) and sets each run beside the plain GEMM of its task."""

import pytest

from lab.bench import ncu_report

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


def _stall_text(runs: dict) -> str:
    """ncu CSV in profile-stalls' form: {what: (time ns, {reason: value})} for k7 7B."""
    lines = []
    for what, (time_ns, reasons) in runs.items():
        lines.append(f"==> /root/out/stalls/ncu-k7-7B-{what}.csv <==")
        metrics = [("gpu__time_duration.sum", time_ns)] + [
            (f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio", v) for r, v in reasons.items()]
        for metric, value in metrics:
            lines.append(",".join(f'"{x}"' for x in ["0", "757", "python3.12", "127.0.0.1", f"kernel_cutlass_{what}", "1",
                                                      "7", "(384, 1, 1)", "(1, 2, 66)", "0", "9.0",
                                                      "Command line profiler metrics", metric, "inst", value]))
    return "\n".join(lines) + "\n"


def test_stall_runs_are_set_beside_the_plain_gemm_and_the_c_load_warp_beside_its_twin():
    text = _stall_text({"gemm": ("2,000,000", {"long_scoreboard": "7.00", "barrier": "2.50"}),
                        "fused": ("2,200,000", {"long_scoreboard": "4.00", "barrier": "1.00"}),
                        "fused-cl": ("2,156,000", {"long_scoreboard": "5.00", "barrier": "1.00"})})
    rows = {r["what"]: r for r in ncu_report.stalls(ncu_report.parse_stalls(text))}
    assert rows["fused"]["time_over_gemm"] == pytest.approx(1.1) and "time_over_twin" not in rows["fused"]
    cl = rows["fused-cl"]
    assert cl["time_over_twin"] == pytest.approx(0.98) and cl["stalls"] == {"long_scoreboard": 5.0, "barrier": 1.0}
    assert cl["stalls_minus_twin"]["long_scoreboard"] == pytest.approx(1.0)
    assert cl["stalls_minus_gemm"]["barrier"] == pytest.approx(-1.5)
    table = ncu_report.stalls_markdown(list(rows.values()))
    assert table.splitlines()[0].endswith("| long_scoreboard | barrier |")
    assert "| k7 | 7B | fused-cl | 1.078 | 0.980 |  | 5.00 | 1.00 |" in table  # warps active: not profiled here


def test_a_profile_without_stall_metrics_is_an_error(tmp_path, capsys):
    (tmp_path / "s.txt").write_text(_stall_text({"fused": ("1,000", {})}))
    with pytest.raises(SystemExit) as e:
        ncu_report.main([str(tmp_path / "s.txt"), "--stalls", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "warp-stall" in capsys.readouterr().err
