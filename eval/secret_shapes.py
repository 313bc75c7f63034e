"""Hidden shapes: every evaluation also checks shapes nobody can see in advance.

Drawn from the evaluation's secret seed, beside the named shape set: M not a multiple of
any tile (64 and up), the width d any whole number of heads in a range (widths no named
set uses among them), N and K ragged against 64-wide tiles where the task's shapes allow
(F and V move in steps of 8, the 16-byte rows the GPU's TMA needs), so a kernel that is
right only on the public shapes, only at listed widths, or only on whole tiles, fails. Results say that a hidden
shape failed and by how much, never which dims it had (eval/numerics.withhold).
"""

from __future__ import annotations

import hashlib
import random

from epiforge.tasks.spec import ShapeSet

#: per named set: the ranges hidden shapes are drawn from. d is any whole number of heads
#: of head_dim in its range (so also widths no named set uses, which a kernel cannot list)
RANGES = {
    "smoke": {"M": (130, 420), "d": (128, 1024), "V": (1000, 3000)},
    "paper": {"M": (4100, 8150), "d": (1536, 4608), "V": (8000, 20000)},
    "coda": {"M": (2100, 8150), "d": (1536, 4608), "V": (8000, 20000)},
}
HEAD_DIM = 128


def hidden_shapes(set_name: str, seed: int, count: int = 2, *, tokens_in_rows: bool = False) -> list[ShapeSet]:
    """`count` shapes drawn from the seed (reproducible with it, unpredictable without).
    From the second on, d is a width no named shape of the set has. tokens_in_rows: some GEMM
    of the task has M as its N or K (a weight gradient), which the GPU's TMA needs a multiple
    of 8 (16-byte rows): M is then a multiple of 8, still of no tile (Task.tokens_in_rows)."""
    from epiforge.tasks import shape_sets

    named = {s.d for s in shape_sets().get(set_name, [])}
    ranges = RANGES.get(set_name, RANGES["smoke"])
    out = []
    for i in range(count):
        digest = hashlib.sha256(f"epiforge:hidden:{set_name}:{seed}:{i}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        lo, hi = ranges["M"]
        batch = rng.choice((1, 2))
        seq = rng.randrange(lo // batch, hi // batch)
        while (batch * seq) % 64 == 0 or (tokens_in_rows and (batch * seq) % 8):
            seq += 1
        d_lo, d_hi = ranges["d"]
        widths = [HEAD_DIM * k for k in range(d_lo // HEAD_DIM, d_hi // HEAD_DIM + 1)]
        d = rng.choice(widths if i == 0 else [w for w in widths if w not in named] or widths)
        # F near 8d/3, a multiple of 8 but not of 64 (ragged N tiles where N = 2F, K = F ...)
        f = (8 * d // 3) // 64 * 64 + 8 * rng.randrange(1, 8)
        v_lo, v_hi = ranges["V"]
        v = rng.randrange(v_lo // 64, v_hi // 64) * 64 + 8 * rng.randrange(1, 8)
        out.append(ShapeSet(name=f"hidden-{i + 1}", M=batch * seq, seq=seq, d=d, F=f, V=v, head_dim=HEAD_DIM))
    return out
