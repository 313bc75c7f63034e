"""The SM90 tile configurations the bench tries (a subset of quack 0.6.5's own autotune
space, gemm_config._get_sm90_configs) and where the objects with line info are cached (the
carried cache itself: eval.precompiled.CACHE_DIR)."""

from __future__ import annotations


from epiforge.primitives.config import GemmConfig
from epiforge.eval.machine import REPO

#: the carried objects (eval.precompiled.CACHE_DIR) built with line info (precompile
#: --lineinfo) for per-instruction profiles: quack's cache key does not hold the option, so
#: they keep a folder of their own
LINEINFO_CACHE_DIR = REPO / ".epiforge" / "quack-cache-lineinfo"

CANDIDATES = [
    GemmConfig(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True),  # quack's SM90 default
    GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=128, tile_n=256, cluster_m=2, cluster_n=1, pingpong=False),
    GemmConfig(tile_m=256, tile_n=128, cluster_m=2, cluster_n=1, pingpong=False),
    GemmConfig(tile_m=256, tile_n=192, cluster_m=1, cluster_n=2, pingpong=False),
    GemmConfig(tile_m=128, tile_n=160, cluster_m=1, cluster_n=2, pingpong=True),
    # a second round, for the shapes the first six left short of their targets
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True),
    GemmConfig(tile_m=128, tile_n=64, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=128, tile_n=192, cluster_m=1, cluster_n=2, pingpong=True),
    GemmConfig(tile_m=128, tile_n=208, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2, pingpong=False),
    GemmConfig(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2, pingpong=False),
    GemmConfig(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True, max_swizzle_size=1),
    # a third round, for the epilogue-heavy short-K shapes (k7, k0 at d = 2048): narrower
    # pingpong tiles keep the accumulator and the epilogue's operands in registers
    GemmConfig(tile_m=128, tile_n=96, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=128, tile_n=160, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=64, tile_n=256, cluster_m=2, cluster_n=1, pingpong=True),
    GemmConfig(tile_m=192, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True),
    # a fourth round, for epilogues that load C or tiles (k0, k6, k7: WITH_C_LOADS): one C
    # stage leaves shared memory for another mainloop A/B stage (cooperative 256-wide tiles
    # get 3 instead of 2; see primitive_docs/gemm_config.md)
    GemmConfig(tile_m=256, tile_n=192, cluster_m=1, cluster_n=2, pingpong=False, epi_c_stages=1),
    GemmConfig(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2, pingpong=False, epi_c_stages=1),
    GemmConfig(tile_m=128, tile_n=256, cluster_m=1, cluster_n=2, pingpong=False, epi_c_stages=1),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True, epi_c_stages=1),
    GemmConfig(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True, epi_c_stages=1),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True, epi_c_stages=2),
    # a fifth round, the other way: quack issues a tile's C loads only when its epilogue
    # starts and keeps at most 4-5 in flight, so a short-K tile's epilogue waits on DRAM
    # latency with ~32 KB outstanding per SM; as many C stages as the tile has epilogue
    # sub-tiles (8 on 128x128) put the whole tile's C in flight at once
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True, epi_c_stages=8),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True, epi_c_stages=6),
    GemmConfig(tile_m=128, tile_n=128, cluster_m=2, cluster_n=1, pingpong=True, epi_c_stages=8),
    GemmConfig(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2, pingpong=True, epi_c_stages=8),
    GemmConfig(tile_m=128, tile_n=192, cluster_m=2, cluster_n=1, pingpong=True, epi_c_stages=8),
    GemmConfig(tile_m=128, tile_n=160, cluster_m=2, cluster_n=1, pingpong=True, epi_c_stages=8),
]

#: the candidates with epi_c_stages set change only kernels whose epilogue loads C or tiles
C_STAGE_CANDIDATES = [i for i, c in enumerate(CANDIDATES) if c.epi_c_stages is not None]
WITH_C_LOADS = ("k0", "k6", "k7")

#: the early prologue C loads (GemmConfig.early_c_loads, primitives/early_c.py) against the
#: same kernels without them, for k7 and k0 (128x128 pingpong at every paper scale but 70B):
#: their tuned configs (k7's _cs2 gets 5 C stages, k0's default 4, where the flag needs 5 of
#: the tile's 8 sub-tiles) and the C depths the flag can take. Not in CANDIDATES: the flag
#: refuses a GEMM without C, so a sweep of every task cannot take it.
EARLY_C_CONFIGS = [
    GemmConfig.parse(k) for k in (
        "128x128_c1x2_pp", "128x128_c1x2_pp_cs2",
        "128x128_c1x2_pp_cs5", "128x128_c1x2_pp_cs5_ec",
        "128x128_c1x2_pp_cs6", "128x128_c1x2_pp_cs6_ec",
        "128x128_c1x2_pp_cs8", "128x128_c1x2_pp_cs8_ec",
    )
]
#: the C-load warp (GemmConfig.c_load_warp, primitives/c_load_warp.py) against the same
#: kernels without it, for k0, k7 and k6: their tuned configs at every paper scale (k0 and
#: k7 at 128x128 pingpong with quack's or 2 C stages, k7 70B at 128x192, k6 at 1 C stage
#: and 192x128) and a whole tile of C stages (8), which a warp that prefetches across tiles
#: may now use. Not in CANDIDATES: the flag refuses a GEMM without C.
C_LOAD_WARP_CONFIGS = [
    GemmConfig.parse(k) for base in (
        "128x128_c1x2_pp", "128x128_c1x2_pp_cs2", "128x128_c1x2_pp_cs1", "128x128_c1x2_pp_cs8",
        "128x192_c2x1_pp", "192x128_c1x2_pp",
    ) for k in (base, f"{base}_cl")
]
#: the epilogue sub-tile twice as wide (GemmConfig.epi_tile_n=64: half as many sub-tiles,
#: each one's fence, barrier and TMA stores) against quack's 32, at the configs k0 and k7 run
#: at 1B and 7B, with and without the C-load warp (issue 16: the stall profile found the
#: store issue, not C's latency, left in the epilogue; lab/results/h100/stalls)
EPI_TILE_CONFIGS = [
    c for base in (
        "128x128_c1x2_pp", "128x128_c1x2_pp_cs2", "128x128_c1x2_pp_cs1", "128x128_c1x2_pp_cs2_cl",
        "128x128_c1x2_pp_cs1_cl", "128x192_c2x1_pp", "192x128_c1x2_pp",
    ) for c in (GemmConfig.parse(base), GemmConfig.parse(base).model_copy(update={"epi_tile_n": 64}))
]
#: issue 16's closing run (lab/bench/ceiling.py): the configs where k0, k7 and k6 ran fastest at 1B
#: and 7B with and without the C-load warp (c-load-warp.json, k7-cl-pick.json), each with its
#: twin, so that the kernels, their diagnostics and the plain GEMM meet in one interleaved run
C_LOAD_CEILING_CONFIGS = [
    GemmConfig.parse(k) for base in (
        "128x128_c1x2_pp", "128x128_c1x2_pp_cs2", "128x128_c1x2_pp_cs1", "192x128_c1x2_pp",
    ) for k in (base, f"{base}_cl")
]
#: the fused model's GEMMs at LLaMA-3's layers (tasks/shapes.toml llama3; lab/bench/h200.sh
#: sweep-llama3): pingpong and cooperative tiles, with and without one C stage (at the 1B LM
#: head's K = 128256 k6 ran fastest cooperative with one C stage, lab/results/h100/
#: sweep-llama1b-k6), and the configs k0, k2, k6 and k7 take today from their nearest shapes
LLAMA3_CONFIGS = [GemmConfig.parse(k) for k in (
    "128x192_c2x1_pp", "128x128_c2x1_pp", "128x256_c2x1", "256x128_c2x1", "128x128_c1x2_pp", "192x128_c1x2_pp",
    "128x192_c1x2_pp", "256x128_c1x2", "128x256_c1x2", "192x128_c2x1_pp", "256x128_c1x2_cs1",
    "128x128_c1x2_pp_cs1", "128x128_c1x2_pp_cs2", "128x128_c1x2_pp_cs1_cl", "128x160_c2x1_pp",
)]
#: named config lists for --configs (beside CANDIDATES indexes and config keys)
CONFIG_SETS = {"early-c": EARLY_C_CONFIGS, "c-load-warp": C_LOAD_WARP_CONFIGS, "epi-tile": EPI_TILE_CONFIGS,
               "c-load-ceiling": C_LOAD_CEILING_CONFIGS, "llama3": LLAMA3_CONFIGS}


def config_args(args: list[str]) -> list[GemmConfig]:
    """--configs of bench.run and bench.precompile: each an index into CANDIDATES, a config
    key (GemmConfig.parse, e.g. 128x128_c1x2_pp_cs5_ec or 128x128_c1x2_pp_cl) or the name of a CONFIG_SETS list."""
    out = []
    for a in args:
        if a.isdigit():
            out.append(CANDIDATES[int(a)])
        elif a in CONFIG_SETS:
            out.extend(CONFIG_SETS[a])
        else:
            out.append(GemmConfig.parse(a))
    return list({c.key(): c for c in out}.values())

