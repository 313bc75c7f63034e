"""The GEMM's tile configuration: the only knobs of the fixed mainloop a kernel turns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
    max_swizzle_size: int = 8

    def key(self) -> str:
        """A short stable name, e.g. for caches and reports: 128x192_c2x1_pp."""
        pp = "_pp" if self.pingpong else ""
        return f"{self.tile_m}x{self.tile_n}_c{self.cluster_m}x{self.cluster_n}{pp}"


DEFAULT_CONFIG = GemmConfig()
