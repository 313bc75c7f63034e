"""bench.epilogue_stalls on a real object built with line info (cross-compiled for sm_90a
here) and a source page made from it: each instruction's role, the match of a profile to its
object, the sums."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys

import pytest

from lab.bench import epilogue_stalls as E
from epiforge.eval.machine import REPO

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REASONS = ["stall_barrier", "stall_long_sb", "stall_wait"]


@pytest.fixture(scope="module")
def lineinfo_objects(tmp_path_factory):
    """k0's expert kernel at its C-load-warp config, built with line info: the epilogue, the
    mainloop, the A/B loads and the C-load warp in one kernel."""
    cache = tmp_path_factory.mktemp("lineinfo")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-m", "lab.bench.precompile", "--lineinfo", "--tasks", "k0",
                          "--configs", "128x128_c1x2_pp_cl", "--parts", "kernels", "--cache-dir", str(cache)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    objects = E.objects_sass(cache)
    assert len(objects) == 1, objects.keys()
    return objects


def test_roles_of_source_lines():
    assert E.role_of("quack/gemm_sm90.py", "GemmSm90.mma") == "mainloop"
    assert E.role_of("quack/gemm_base.py", "GemmBase.epilogue") == "epilogue"
    assert E.role_of("quack/epilogue/library.py", "rms_partial_epi") == "epilogue"
    assert E.role_of("quack/gemm_base.py", "GemmTmaBase.load_tma") == "A/B loads"
    assert E.role_of("primitives/c_load_warp.py", "c_load_warp") == "C-load warp"
    assert E.role_of("quack/tile_scheduler.py", "TileScheduler.get_current_work") == "tile scheduler"
    # helpers every role calls take the role of the code around them
    assert E.role_of("quack/pipeline.py", "PipelineTmaAsync.producer_acquire") is None
    assert E.role_of("quack/gemm_base.py", "GemmTmaBase.epilog_gmem_copy_and_partition") is None
    assert E.role_of("quack/gemm_sm90.py", "<module>") is None


def test_every_instruction_of_a_lineinfo_object_has_its_role(lineinfo_objects):
    (sass,) = lineinfo_objects.values()
    by_op = lambda op: [r for r in sass if E._opcode(r["sass"]).startswith(op)]  # noqa: E731
    assert by_op("HGMMA") and {r["role"] for r in by_op("HGMMA")} == {"mainloop"}
    assert by_op("UTMASTG") and {r["role"] for r in by_op("UTMASTG")} == {"epilogue"}  # D's TMA stores
    # the C-load warp issues C's TMA loads; the A/B warp the others; no consumer issues any
    loads = {r["role"] for r in by_op("UTMALDG")}
    assert loads == {"C-load warp", "A/B loads"}, loads
    # no machine path in what a result file would carry
    assert all(not r["file"].startswith("/") for r in sass), {r["file"] for r in sass if r["file"].startswith("/")}
    assert any(r["file"].startswith("generated/quack_gemm_sm90_kernel") for r in sass)  # primitives' edited kernel
    # every retry loop after EXIT took a role from the code it returns to
    tails = [r for r in sass if r.get("tail_of") is not None]
    assert tails and all(r["role"] != "kernel" or sass[r["tail_of"] - 1]["role"] == "kernel" for r in tails)


def _source_page(sass: list[dict], samples) -> str:
    """A source page as Nsight Compute writes it: absolute addresses, each instruction's text,
    its samples (the `samples(row)` given) split over the reasons."""
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(["Kernel Name", "kernel_cutlass_test"])
    w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
                *REASONS, *(f"{r} (Not Issued)" for r in REASONS)])
    base = 0x7F0000001000
    for r in sass:
        n = samples(r)
        w.writerow([hex(base + r["offset"]), "      " + r["sass"], n, n, 0, n, 0, 0, n, 0])
    return out.getvalue()


def test_a_profile_is_matched_to_its_object_and_summed(lineinfo_objects):
    ((name, sass),) = lineinfo_objects.items()
    hgmma = sum(1 for r in sass if E._opcode(r["sass"]).startswith("HGMMA"))
    epi_trywaits = sum(1 for r in sass if r["role"] == "epilogue" and "TRYWAIT" in r["sass"])
    assert hgmma and epi_trywaits

    def samples(r):
        if E._opcode(r["sass"]).startswith("HGMMA"):
            return 5
        return 7 if r["role"] == "epilogue" and "TRYWAIT" in r["sass"] else 0

    text = "==> run-a <==\n" + _source_page(sass, samples) + "==> run-a details <==\n\"0\",\"Duration\"\n"
    runs = E.read_runs(text)
    assert list(runs) == ["run-a"] and len(runs["run-a"]) == len(sass)
    decoy = {"decoy": [dict(r, sass="NOP") for r in sass]}
    obj, matched, score = E.match_object(runs["run-a"], {**decoy, **lineinfo_objects})
    assert obj == name and score == 1.0
    report = E.summarize("run-a", runs["run-a"], obj, matched, score)
    assert report["samples"] == 5 * hgmma + 7 * epi_trywaits
    assert report["roles"]["mainloop"]["samples"] == 5 * hgmma
    assert report["roles"]["mainloop"]["reasons"] == {"long_sb": 5 * hgmma}
    assert report["epilogue_waits"]["samples"] == 7 * epi_trywaits
    assert report["epilogue_waits"]["share_of_epilogue"] == 1.0


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert E.main([str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("==> run <==\nnot a source page\n")
    assert E.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no source page" in err and len(err.strip().splitlines()) == 1
    # another tool's columns (no samples), or rows without an address: not a source page either
    other = tmp_path / "other.txt"
    other.write_text('==> run <==\n"Address","Source","Executed"\n"0x10","NOP","3"\n'
                     '==> run2 <==\n"Address","Source","Warp Stall Sampling (All Samples)"\n"n/a","NOP","3"\n')
    assert E.main([str(other)]) == 2 and "no source page" in capsys.readouterr().err
    page = tmp_path / "page.txt"
    page.write_text('==> run <==\n"Address","Source","Warp Stall Sampling (All Samples)"\n"0x10","NOP","3"\n')
    assert E.main([str(page), "--objects", str(tmp_path / "none")]) == 2
    assert "no objects under" in capsys.readouterr().err
    bad_obj = tmp_path / "objs" / "fp"
    bad_obj.mkdir(parents=True)
    (bad_obj / "x.o").write_bytes(b"not an object")
    assert E.main([str(page), "--objects", str(tmp_path / "objs")]) == 2
    err = capsys.readouterr().err
    assert "cannot disassemble" in err and len(err.strip().splitlines()) == 1
