"""GemmConfig: keys, the SM90 tile rules, and the epilogue C-stage knob's effect on the
compiled kernel's shared-memory split (checked by cross-compiling for sm_90a)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import primitives as P
from bench.configs import CANDIDATES

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("cfg", CANDIDATES, ids=lambda c: c.key())
def test_key_round_trips(cfg):
    assert P.GemmConfig.parse(cfg.key()) == cfg


def test_keys_name_every_knob_that_changes_the_kernel():
    keys = {c.key() for c in CANDIDATES}
    assert len(keys) == len(CANDIDATES)
    assert P.GemmConfig(epi_c_stages=1).key() == "128x192_c2x1_pp_cs1"
    assert P.GemmConfig(max_swizzle_size=1, epi_c_stages=2).key() == "128x192_c2x1_pp_sw1_cs2"


@pytest.mark.parametrize("bad", [{"epi_c_stages": 0}, {"epi_c_stages": 17}, {"tile_m": 256, "tile_n": 128}])
def test_bad_configs_are_refused(bad):
    with pytest.raises((ValidationError, ValueError)):
        P.GemmConfig(**bad)


def test_bad_key_is_one_clear_error():
    with pytest.raises(ValueError, match="not a config key"):
        P.GemmConfig.parse("128x192_pp")


STAGES_SCRIPT = """
import json, sys
import tasks, primitives as P
from eval.kernel import HUMAN_DIR, load_kernel_module
from primitives import lowering
dims = tasks.shape_sets()["smoke"][0].dims()
for arg in sys.argv[1:]:
    tid, key = arg.split(":")
    task = tasks.get_task(tid)
    module = load_kernel_module(HUMAN_DIR / f"{task.name}.py")
    inputs = task.make_inputs(dims, seed=0)
    module.run(dict(inputs), {}, config=P.GemmConfig.parse(key))
print(json.dumps(lowering.STAGES))
"""


def _stages(tmp_path, *runs: str) -> dict[str, list[int]]:
    """{"<class> <tile> [pp] [csN]": [A/B, D, C stages]} of the kernels that "task:config"
    runs trace, cross-compiled for sm_90a in a fresh process."""
    env = {**os.environ, "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "EPIFORGE_CROSS_COMPILE": "1",
           "QUACK_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", STAGES_SCRIPT, *runs], env=env,
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _one(stages: dict, suffix: str) -> list[int]:
    (found,) = [v for k, v in stages.items() if k.endswith(suffix)]
    return found


def test_epi_c_stages_moves_shared_memory_between_mainloop_and_epilogue(tmp_path):
    """k6 (C + a tile load) on a cooperative 256x192 tile: quack's default split leaves the
    mainloop 2 A/B stages; epi_c_stages=1 makes room for 3 (what the plain GEMM gets). The
    other way, k7 on 128x128 pingpong: epi_c_stages=8 puts all 8 of a tile's C sub-tiles in
    flight and the mainloop pays an A/B stage for it."""
    stages = _stages(tmp_path, "k6:256x192_c1x2", "k6:256x192_c1x2_cs1", "k7:128x128_c1x2_pp",
                     "k7:128x128_c1x2_pp_cs8")
    default, one = _one(stages, "256x192"), _one(stages, "256x192 cs1")
    assert default[0] == 2 and one[0] == 3, stages
    assert one[2] < default[2]  # paid for with C stages
    default, eight = _one(stages, "128x128 pp"), _one(stages, "128x128 pp cs8")
    assert eight[2] == 8 and default[2] < 8, stages
    assert eight[0] < default[0]  # paid for with A/B stages
