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
task = tasks.get_task("k6")
dims = tasks.shape_sets()["smoke"][0].dims()
module = load_kernel_module(HUMAN_DIR / f"{task.name}.py")
inputs = task.make_inputs(dims, seed=0)
for key in sys.argv[1:]:
    module.run(dict(inputs), {}, config=P.GemmConfig.parse(key))
print(json.dumps(lowering.STAGES))
"""


def test_one_c_stage_gives_the_mainloop_a_third_stage(tmp_path):
    """k6 (C + a tile load) on a cooperative 256x192 tile: quack's default split leaves the
    mainloop 2 A/B stages; epi_c_stages=1 makes room for 3 (what the plain GEMM gets)."""
    env = {**os.environ, "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "EPIFORGE_CROSS_COMPILE": "1",
           "QUACK_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", STAGES_SCRIPT, "256x192_c1x2", "256x192_c1x2_cs1"], env=env,
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    stages = json.loads(out.stdout.strip().splitlines()[-1])
    default = next(v for k, v in stages.items() if k.endswith("256x192"))
    one = next(v for k, v in stages.items() if k.endswith("256x192 cs1"))
    assert default[0] == 2 and one[0] == 3, stages
    assert one[2] < default[2]  # paid for with C stages
