"""bench.ceiling: issue 16's rows against the floors their diagnostics measure, from a
synthetic bench file whose ratios are known by construction."""

from lab.bench import ceiling
from lab.tests.test_bench_tuning import _row, _t, _write

K7 = "k7_gemm_partial_swiglu_bwd"


def _k7_file(tmp_path):
    # every time against cuBLAS at 100 us; the plain GEMM's fastest config takes 100 us too,
    # so each ratio is the time / 100
    configs = {
        "128x128_c1x2_pp_cs2": {"fused": _t(125.0), "gemm_quack": _t(100.0),
                                "diagnostics": {"without_zdz": _t(123.0), "stores_only": _t(109.0),
                                                "c_and_stores": _t(121.0)}},
        "128x128_c1x2_pp_cs2_cl": {"fused": _t(118.0), "gemm_quack": _t(101.0),
                                   "diagnostics": {"without_zdz": _t(115.0), "c_and_stores": _t(114.0)},
                                   "errors": {"diag_stores_only": "ValueError: the C-load warp needs C"}},
    }
    row = _row(K7, configs=configs, gemm_cublas=_t(100.0))
    row2 = _row("k8_gemm_swiglu", configs={"128x128_c1x2_pp": {"fused": _t(101.0), "gemm_quack": _t(100.0)}},
                gemm_cublas=_t(100.0))  # not an issue-16 row: left out
    return _write(tmp_path / "ceiling.json", [row, row2])


def test_rows_split_the_c_load_warp_and_add_the_reduction_to_each_floor(tmp_path):
    rows = ceiling.ceiling_rows([_k7_file(tmp_path)])
    assert [(r["task"], r["scale"]) for r in rows] == [(K7, "1B")]
    r = rows[0]
    assert r["target"] == 1.12
    assert r["before"][0] == "128x128_c1x2_pp_cs2" and abs(r["before"][1] - 1.25) < 1e-9
    assert r["after"][0] == "128x128_c1x2_pp_cs2_cl" and abs(r["after"][1] - 1.18) < 1e-9
    # the reduction's cost where it is smallest: 1.25 - 1.23 without the warp (with it,
    # 1.18 - 1.15 = 0.03), so each floor stays a lower bound over both configs
    assert abs(r["reduction"] - 0.02) < 1e-9 and r["reduction_config"] == "128x128_c1x2_pp_cs2"
    # stores only ran at one config (1.09); C and stores fastest with the warp (1.14)
    assert r["stores_floor"][0] == "128x128_c1x2_pp_cs2" and abs(r["stores_floor"][1] - 1.11) < 1e-9
    assert r["io_floor"][0] == "128x128_c1x2_pp_cs2_cl" and abs(r["io_floor"][1] - 1.16) < 1e-9
    table = ceiling.markdown(rows)
    assert ("| k7 1B | 1.120 | 1.250 (128x128_c1x2_pp_cs2) | 1.180 (128x128_c1x2_pp_cs2_cl) | "
            "+0.020 (128x128_c1x2_pp_cs2) | 1.110 (128x128_c1x2_pp_cs2) | 1.160 (128x128_c1x2_pp_cs2_cl) |") in table
    assert table.rstrip().endswith("| no |")


def test_a_file_without_issue_16_rows_or_a_missing_file_is_one_line(tmp_path, capsys):
    import pytest

    f = _write(tmp_path / "other.json", [_row("k8_gemm_swiglu", configs={
        "128x128_c1x2_pp": {"fused": _t(101.0), "gemm_quack": _t(100.0)}})])
    for argv, says in (([f], "no row of"), ([str(tmp_path / "missing.json")], "cannot read it")):
        with pytest.raises(SystemExit) as e:
            ceiling.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "error:" in err[-1] and says in err[-1] and "Traceback" not in "".join(err)


def test_a_negative_reduction_adds_nothing_and_a_row_without_timings_is_named(tmp_path):
    k0 = "k0_gemm_residual_partial_rmsnorm"
    rows = [_row(k0, gemm_cublas=_t(100.0), configs={
        "128x128_c1x2_pp": {"fused": _t(110.0), "gemm_quack": _t(100.0),
                            "diagnostics": {"without_sumsq": _t(111.0), "stores_only": _t(104.0)}}}),
            _row(K7, gemm_cublas=_t(100.0), configs={
                "128x128_c1x2_pp": {"errors": {"fused": "RuntimeError: no"}, "gemm_quack": _t(100.0)}}),
            _row("k6_gemm_residual_partial_rmsnorm_bwd", gemm_cublas=_t(100.0), configs={  # no reduction: no floors
                "128x128_c1x2_pp": {"fused": _t(104.0), "gemm_quack": _t(100.0),
                                    "diagnostics": {"without_h": _t(103.0)}}})]
    got = ceiling.ceiling_rows([_write(tmp_path / "c.json", rows)])
    k0_row = next(r for r in got if r["task"] == k0)
    assert abs(k0_row["reduction"] + 0.01) < 1e-9 and abs(k0_row["stores_floor"][1] - 1.04) < 1e-9
    # k0's C load and stores without its reduction is without_sumsq: 1.11, plus 0
    assert abs(k0_row["io_floor"][1] - 1.11) < 1e-9
    k6_row = next(r for r in got if r["task"].startswith("k6"))
    assert k6_row["reduction"] is None and k6_row["stores_floor"] is None and k6_row["io_floor"] is None
    table = ceiling.markdown(got)
    assert "| k6 1B | 1.066 | 1.040 (128x128_c1x2_pp) | - | - | - | - | yes |" in table
    assert "- k0 1B: the reduction's cost is -0.010 (noise): the floors add 0" in table
    assert "- k7 1B: in the files, but the kernel has no timing beside a plain GEMM at any config" in table


def test_a_reduction_is_costed_only_where_the_kernel_ran_beside_it(tmp_path):
    """without_sumsq at a config where the kernel failed costs nothing (no kernel to subtract
    from), and without it at any config the kernel ran, the row has no floors and says why."""
    k0 = "k0_gemm_residual_partial_rmsnorm"
    rows = [_row(k0, gemm_cublas=_t(100.0), configs={
        "128x128_c1x2_pp": {"fused": _t(110.0), "gemm_quack": _t(100.0), "diagnostics": {"stores_only": _t(104.0)}},
        "192x128_c1x2_pp": {"errors": {"fused": "RuntimeError: no"}, "gemm_quack": _t(100.0),
                            "diagnostics": {"without_sumsq": _t(101.0)}}})]
    (r,) = ceiling.ceiling_rows([_write(tmp_path / "c.json", rows)])
    assert r["reduction"] is None and r["stores_floor"] is None and r["io_floor"] is None
    assert "- k0 1B: without_sumsq did not run beside the kernel at any config: no reduction cost, no floors" \
        in ceiling.markdown([r])

