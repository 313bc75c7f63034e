"""GemmConfig.c_load_warp (primitives/c_load_warp.py): its key and rules, its refusals, the
sm_90a cross-compile of k0, k7 and k6 with it, with the C TMA loads found in the producer
warpgroup's code of the SASS. Its GPU check (the same bits as without it) is
tests/primitives/test_gemm_config.py's test_load_timing_flags_give_the_same_bits_on_the_gpu."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from epiforge import primitives as P
from lab.bench.configs import C_LOAD_WARP_CONFIGS, config_args

REPO = Path(__file__).resolve().parents[2]


def test_c_load_warp_key_and_rules():
    cfg = P.GemmConfig(tile_n=128, epi_c_stages=2, c_load_warp=True)
    assert cfg.key() == "128x128_c2x1_pp_cs2_cl" and P.GemmConfig.parse(cfg.key()) == cfg
    coop = P.GemmConfig(tile_m=256, tile_n=128, pingpong=False, c_load_warp=True)
    assert coop.key() == "256x128_c2x1_cl" and P.GemmConfig.parse(coop.key()) == coop  # cooperative too
    assert not P.GemmConfig().c_load_warp  # off by default: no existing key or kernel changes
    assert cfg.for_plain_gemm().key() == "128x128_c2x1_pp_cs2"  # the identity GEMM loads no C
    with pytest.raises(ValidationError, match="early_c_loads and c_load_warp exclude each other"):
        P.GemmConfig(early_c_loads=True, c_load_warp=True)


def test_c_load_warp_takes_a_tile_load_without_c():
    """The C-load warp also issues TileLoad sub-tiles (k6's x): an epilogue that loads a tile
    but no C takes the flag (the emulator's values unchanged); the no-C refusal is in
    tests/primitives/test_gemm_config.py (test_c_load_timing_flags_in_the_emulator)."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(300, 64, generator=g).bfloat16(), (torch.randn(200, 64, generator=g) / 8).bfloat16()
    x = torch.randn(300, 200, generator=g).bfloat16()

    @P.epilogue(operands={"x": P.Tile()})
    def scaled(acc, x):
        return {"D": acc * x}

    want = scaled(a, w, x=x, config=P.GemmConfig(tile_n=128))
    got = scaled(a, w, x=x, config=P.GemmConfig(tile_n=128, c_load_warp=True))
    assert torch.equal(want["D"], got["D"])


def test_bench_config_args_take_the_c_load_warp_set():
    assert config_args(["c-load-warp"]) == C_LOAD_WARP_CONFIGS
    flagged = [c for c in C_LOAD_WARP_CONFIGS if c.c_load_warp]
    # every flagged config is timed beside its flag-less twin
    assert flagged and {c.for_plain_gemm().key() for c in flagged} == {
        c.key() for c in C_LOAD_WARP_CONFIGS if not c.c_load_warp}
    # the tuned configs of the C-loading expert kernels at 1B and 7B are among the twins
    assert {"128x128_c1x2_pp", "128x128_c1x2_pp_cs2", "128x128_c1x2_pp_cs1", "192x128_c1x2_pp"} <= {
        c.key() for c in C_LOAD_WARP_CONFIGS}


C_LOAD_SCRIPT = r"""
import json, sys
from pathlib import Path
from epiforge import primitives as P, tasks
from lab.bench.sass import sass_of
from epiforge.eval.kernel import HUMAN_DIR, load_kernel_module
from epiforge.primitives import lowering

cache = Path(sys.argv[1])
dims = tasks.shape_sets()["smoke"][0].dims()

def places(sass: str) -> dict:
    # the producer warpgroup's code runs up to the consumers' register increase
    producer, _, consumer = sass.partition("USETMAXREG.TRY_ALLOC")
    assert consumer, "no consumer register increase in the SASS"
    return {"ldg_producer": producer.count("UTMALDG"), "ldg_consumer": consumer.count("UTMALDG"),
            "gate_wait": producer.count("BAR.SYNC.DEFER_BLOCKING 0x2, 0x40"),
            "gate_open": producer.count("BAR.ARV 0x2, 0x40")}


out = {"errors": {}, "sass": {}}
for arg in sys.argv[2:]:
    tid, key = arg.split(":")
    task = tasks.get_task(tid)
    module = load_kernel_module(HUMAN_DIR / f"{task.name}.py")
    before = set(cache.rglob("*.o"))
    try:
        module.run(dict(task.make_inputs(dims, seed=0)), {}, config=P.GemmConfig.parse(key))
    except lowering.CompileError as e:
        out["errors"][arg] = str(e)
        continue
    (obj,) = set(cache.rglob("*.o")) - before
    out["sass"][arg] = places(sass_of(obj))
out["stages"] = lowering.STAGES

# quack text the edits do not expect (here: another of its methods) fails loudly
import quack.gemm_sm90
from types import SimpleNamespace
from epiforge.primitives import c_load_warp
try:
    c_load_warp._edited(quack.gemm_sm90.GemmSm90.pingpong_barrier_sync, "GemmSm90.kernel", (), c_load_warp._KERNEL_EDITS)
except c_load_warp.CLoadWarpError as e:
    out["errors"]["edit"] = str(e)
fine = dict(split_k=1, gather_A=False, num_ab_load_warps=1, epi_c_stage=4)
for name, bad in {"split_k": {"split_k": 2}, "gather_A": {"gather_A": True, "num_ab_load_warps": 4},
                  "no C": {"epi_c_stage": 0}, "fine": {}}.items():
    try:
        c_load_warp.check(SimpleNamespace(**{**fine, **bad}))
    except c_load_warp.CLoadWarpError as e:
        out["errors"][name] = str(e)
print(json.dumps(out))
"""

#: the configs the flag is compiled at: the tuned ones of k7 (1B/7B, 70B), k0 (1B/7B) and
#: k6 (1B), all pingpong, and a cooperative one (k6 at 256x192); plus k7's tuned config
#: without the flag, where the consumers issue C
C_LOAD_RUNS = ["k7:128x128_c1x2_pp_cs2", "k7:128x128_c1x2_pp_cs2_cl", "k7:128x192_c2x1_pp_cl",
               "k0:128x128_c1x2_pp_cl", "k6:128x128_c1x2_pp_cs1_cl", "k6:256x192_c1x2_cs1_cl"]


@pytest.mark.spawns
def test_c_load_warp_cross_compiles_with_the_c_loads_on_the_producer_warp(tmp_path):
    """k7, k0 and k6 compile for sm_90a with the flag (pingpong and cooperative), with the
    stage split of the flag-less kernel. In the SASS, the flag-less kernel's consumers issue
    the C TMA loads (UTMALDG after the consumers' register increase); with the flag no
    UTMALDG is left there, and the producer warpgroup has one more (the C-load warp's,
    behind the A/B warp's EpilogueLoad gate: named barrier 2, 64 threads)."""
    env = {**os.environ, "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "EPIFORGE_CROSS_COMPILE": "1",
           "QUACK_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", C_LOAD_SCRIPT, str(tmp_path), *C_LOAD_RUNS], env=env,
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    errors, sass, stages = got["errors"], got["sass"], got["stages"]
    assert set(errors) == {"edit", "split_k", "gather_A", "no C"}, errors
    assert "GemmSm90.kernel is not the text primitives/c_load_warp.py edits" in errors["edit"]
    assert "does not support split_k > 1" in errors["split_k"] and "gather_A" in errors["gather_A"]
    assert "loads no C and no tile" in errors["no C"]

    plain = sass["k7:128x128_c1x2_pp_cs2"]
    assert plain["ldg_consumer"] > 0 and plain["gate_wait"] == plain["gate_open"] == 0, plain
    for run in C_LOAD_RUNS[1:]:
        assert sass[run]["ldg_consumer"] == 0, (run, sass[run])
        assert sass[run]["gate_wait"] == 1 and sass[run]["gate_open"] == 1, (run, sass[run])
    assert sass["k7:128x128_c1x2_pp_cs2_cl"]["ldg_producer"] == plain["ldg_producer"] + 1, sass

    k7 = {k.split(" ", 1)[1]: v for k, v in stages.items() if "dswiglu" in k}
    assert k7["128x128 pp cs2 cl"] == k7["128x128 pp cs2"] == [5, 2, 5], stages  # the warp costs no smem
    assert sum(k.split(" ", 1)[0].endswith("_c_load_warp") for k in stages) == len(C_LOAD_RUNS) - 1, stages
    assert not any(k.split(" ", 1)[0].endswith("_c_load_warp") for k in stages if not k.endswith(" cl")), stages
