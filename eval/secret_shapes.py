"""Hidden shapes: every evaluation also checks shapes nobody can see in advance.

Drawn from the evaluation's secret seed, beside the named shape set: M not a multiple of
any tile (64 and up), N and K ragged against 64-wide tiles where the task's shapes allow
(F and V move in steps of 8, the 16-byte rows the GPU's TMA needs), so a kernel that is
right only on the public shapes, or only on whole tiles, fails. Results say that a hidden
shape failed and by how much, never which dims it had (eval/numerics.withhold).
"""

from __future__ import annotations

import hashlib
import random

from tasks.spec import ShapeSet

#: per named set: the ranges hidden shapes are drawn from (d stays whole heads of head_dim)
RANGES = {
    "smoke": {"M": (130, 420), "d": (256, 384, 512), "V": (1000, 3000)},
    "paper": {"M": (4100, 8150), "d": (2048, 4096), "V": (8000, 20000)},
}
HEAD_DIM = 128


def hidden_shapes(set_name: str, seed: int, count: int = 1) -> list[ShapeSet]:
    """`count` shapes drawn from the seed (reproducible with it, unpredictable without)."""
    ranges = RANGES.get(set_name, RANGES["smoke"])
    out = []
    for i in range(count):
        digest = hashlib.sha256(f"epiforge:hidden:{set_name}:{seed}:{i}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        lo, hi = ranges["M"]
        batch = rng.choice((1, 2))
        seq = rng.randrange(lo // batch, hi // batch)
        while (batch * seq) % 64 == 0:
            seq += 1
        d = rng.choice(ranges["d"])
        # F near 8d/3, a multiple of 8 but not of 64 (ragged N tiles where N = 2F, K = F ...)
        f = (8 * d // 3) // 64 * 64 + 8 * rng.randrange(1, 8)
        v_lo, v_hi = ranges["V"]
        v = rng.randrange(v_lo // 64, v_hi // 64) * 64 + 8 * rng.randrange(1, 8)
        out.append(ShapeSet(name=f"hidden-{i + 1}", M=batch * seq, seq=seq, d=d, F=f, V=v, head_dim=HEAD_DIM))
    return out
