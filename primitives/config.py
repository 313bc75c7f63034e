"""The GEMM's tile configuration: the only knobs of the fixed mainloop a kernel turns."""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, model_validator


class GemmConfig(BaseModel):
    """Tile and cluster shape of the quack SM90 GEMM. The emulator needs only tile_m and
    tile_n (they fix the partial-reduction layout); the GPU uses all of it. The default
    is quack 0.6.5's SM90 default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tile_m: int = Field(128, description="rows of the output tile one CTA computes")
    tile_n: int = Field(192, description="columns of the output tile one CTA computes")
    cluster_m: int = Field(2, ge=1, le=2)
    cluster_n: int = Field(1, ge=1, le=2)
    pingpong: bool = Field(True, description="two consumer warpgroups alternate tiles")
    max_swizzle_size: int = Field(8, ge=1)
    epi_c_stages: int | None = Field(
        None, ge=1, le=16,
        description="shared-memory stages for the epilogue's C and tile loads (None: quack's 4, at most the "
                    "epilogue's sub-tiles per tile); fewer leave room for another mainloop A/B stage, which "
                    "long-K tiles with a heavy epilogue need; more (up to all of a tile's sub-tiles) put a whole "
                    "tile's C loads in flight at once, which short-K tiles with a C-heavy epilogue need")
    epi_tile_n: int | None = Field(
        None,
        description="columns of the epilogue's sub-tile (None: quack's choice, 32 for 16-bit outputs): the "
                    "epilogue converts, stores and loads C one sub-tile at a time, each store behind a "
                    "shared-memory fence and a barrier of the warpgroup; wider sub-tiles mean fewer of them and "
                    "more shared memory per epilogue stage. 16, 32, 64 or 128, dividing tile_n. It changes the "
                    "order of the row reductions' partial sums within a tile (float32), never the values stored")
    early_c_loads: bool = Field(
        False,
        description="pingpong only, and only for a GEMM that loads C: issue a tile's first C loads before "
                    "waiting for the other warpgroup's epilogue instead of after it, so they fill while that "
                    "epilogue drains (primitives/early_c.py). The kernel needs more than half of a tile's "
                    "epilogue sub-tiles in C stages (5 of 8 on 128x128; quack gives k7 5, k0 4: set "
                    "epi_c_stages) and refuses to compile otherwise. It changes load timing only, never values")
    c_load_warp: bool = Field(
        False,
        description="only for a GEMM whose epilogue loads C or a tile: an idle warp of the producer warpgroup "
                    "issues the epilogue's C loads, ahead of the consumers and across tiles, so the next tile's "
                    "C is in flight during the current mainloop (primitives/c_load_warp.py). Pingpong and "
                    "cooperative; not with early_c_loads, split-K or varlen. It changes load timing only, "
                    "never values")

    @model_validator(mode="after")
    def _sm90_tile_rules(self):
        """quack 0.6.5's SM90 GEMM compiles only these tiles (gemm_sm90.py; each rule was
        checked with the sm_90a compile, see primitive_docs/gemm_config.md)."""
        tm, tn = self.tile_m, self.tile_n
        if self.pingpong:
            limit = {64: 256, 128: 208, 192: 128}.get(tm)
            ok = limit is not None and tn % 16 == 0 and tn <= limit
        elif tm in (64, 128, 256):
            ok = (tn % 16 == 0 and tn <= 256) or (tn % 32 == 0 and tn <= 512)
        else:
            ok = (tm == 192 and tn % 32 == 0 and tn <= 256) or (tm == 320 and tn % 32 == 0 and tn <= 160)
        if not ok or tn <= 0:
            mode = "pingpong" if self.pingpong else "cooperative"
            raise ValueError(f"tile {tm}x{tn} does not compile for sm_90a as {mode} (see primitive_docs/gemm_config.md)")
        if self.epi_tile_n is not None and (self.epi_tile_n not in (16, 32, 64, 128) or tn % self.epi_tile_n):
            raise ValueError(f"epi_tile_n {self.epi_tile_n}: 16, 32, 64 or 128, dividing tile_n ({tn})")
        if self.early_c_loads and not self.pingpong:
            raise ValueError("early_c_loads needs pingpong=True: it moves C loads ahead of the pingpong epilogue barrier")
        if self.early_c_loads and self.c_load_warp:
            raise ValueError("early_c_loads and c_load_warp exclude each other: with c_load_warp the consumers issue no C loads")
        return self

    def key(self) -> str:
        """A short stable name, e.g. for caches and reports: 128x192_c2x1_pp (+ _sw1 when
        the tile swizzle is not quack's default 8, + _cs1 when epi_c_stages is set, + _en64
        when epi_tile_n is set, + _ec when early_c_loads is set, + _cl when c_load_warp is set)."""
        pp = "_pp" if self.pingpong else ""
        sw = f"_sw{self.max_swizzle_size}" if self.max_swizzle_size != 8 else ""
        cs = f"_cs{self.epi_c_stages}" if self.epi_c_stages is not None else ""
        en = f"_en{self.epi_tile_n}" if self.epi_tile_n is not None else ""
        ec = "_ec" if self.early_c_loads else ""
        cl = "_cl" if self.c_load_warp else ""
        return f"{self.tile_m}x{self.tile_n}_c{self.cluster_m}x{self.cluster_n}{pp}{sw}{cs}{en}{ec}{cl}"

    def for_plain_gemm(self) -> "GemmConfig":
        """This config for a GEMM that loads no C, such as the identity-epilogue GEMM timed
        beside a fused kernel: early_c_loads and c_load_warp dropped (the fields such a GEMM refuses)."""
        if self.early_c_loads or self.c_load_warp:
            return self.model_copy(update={"early_c_loads": False, "c_load_warp": False})
        return self

    @classmethod
    def parse(cls, key: str) -> "GemmConfig":
        """The inverse of key()."""
        m = re.fullmatch(r"(\d+)x(\d+)_c(\d)x(\d)(_pp)?(?:_sw(\d+))?(?:_cs(\d+))?(?:_en(\d+))?(_ec)?(_cl)?", key)
        if not m:
            raise ValueError(f"not a config key: {key!r} (expected e.g. 128x192_c2x1_pp)")
        tm, tn, cm, cn, pp, sw, cs, en, ec, cl = m.groups()
        return cls(tile_m=int(tm), tile_n=int(tn), cluster_m=int(cm), cluster_n=int(cn), pingpong=bool(pp),
                   max_swizzle_size=int(sw) if sw else 8, epi_c_stages=int(cs) if cs else None,
                   epi_tile_n=int(en) if en else None, early_c_loads=bool(ec), c_load_warp=bool(cl))


DEFAULT_CONFIG = GemmConfig()

#: the runner's environment variable naming more configs (keys, comma-separated) that every
#: fused GEMM a CPU evaluation cross-compiles is also built with (`--tuned`: a kernel's TUNED
#: configs, which the smoke shapes never pick)
ALSO_COMPILE_ENV = "EPIFORGE_ALSO_COMPILE"


def tuned_in_source(source: str) -> dict[str, str]:
    """A kernel's module-level TUNED table, read from its text without running it ({} if it
    has none or it is not a literal dict)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TUNED" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return {}
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


def _mnk(key) -> tuple[int, int, int] | None:
    """"MxNxK" -> (M, N, K) of positive ASCII integers; None for any other key."""
    parts = key.split("x") if isinstance(key, str) else []
    ok = len(parts) == 3 and all(x.isascii() and x.isdigit() and int(x) > 0 for x in parts)
    return tuple(int(x) for x in parts) if ok else None


def pick_config(tuned: dict[str, str], a, w) -> GemmConfig:
    """The config for this GEMM's m x n x k (a is (m, k), w is (n, k)) from a kernel's table
    {"16384x2048x2048": "128x128_c1x2_pp", ...}: the shape's own entry, else the entry of the
    nearest measured shape (the smallest sum of |log2| ratios of m, n and k; the first such
    entry on a tie), else DEFAULT_CONFIG (a table with no "MxNxK" key). Why the nearest: a tile config
    measured at a neighbouring shape keeps its reasons (short K makes the epilogue dominate;
    C-loading epilogues want narrow pingpong tiles), where the default can be far off (on the
    H200, k7 at 16384x8192x2048 took 1.69x as long at the default as at 128x128 pingpong
    with a 1x2 cluster, lab/results/h200/sweep-llama1b.json). An empty GEMM gets the default."""
    m, n, k = int(a.shape[0]), int(w.shape[0]), int(a.shape[1])
    key = f"{m}x{n}x{k}"
    if key in tuned:
        return GemmConfig.parse(tuned[key])
    if min(m, n, k) < 1:
        return DEFAULT_CONFIG
    best, best_distance = None, math.inf
    for shape, cfg in tuned.items():
        mnk = _mnk(shape)
        if mnk is None:
            continue
        distance = sum(abs(math.log2(x / t)) for x, t in zip((m, n, k), mnk))
        if distance < best_distance:
            best, best_distance = cfg, distance
    return GemmConfig.parse(best) if best is not None else DEFAULT_CONFIG
