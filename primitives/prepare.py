"""One-time transforms of constant inputs (weights, frequency tables), run before timing
by a kernel's `prepare()`. They may read only the task's constant inputs."""

from __future__ import annotations

import functools
import math

import torch

from epiforge.primitives import program, trace


#: the prepare helpers by name (what a described kernel's "prepare" steps may name)
HELPERS: dict = {}


def _helper(fn):
    """A prepare helper: one recorded step while a kernel is described (primitives/program.py)."""
    @functools.wraps(fn)
    def call(*args, **kw):
        return program.primitive_call("prepare", fn.__name__, fn, args, kw)
    HELPERS[fn.__name__] = call
    return call


@_helper
def rope_freq_table(inv_freq: torch.Tensor, head_dim: int, rotary_cols: int, passthrough_cols: int = 0,
                    direction: int = 1) -> torch.Tensor:
    """The per-column float32 table `primitives.math.rope_rotate` reads as a PerCol operand.

    inv_freq is HF-style, (head_dim/2,): pair j of every head rotates by
    direction * pos * inv_freq[j]; direction +1 is Hugging Face LLaMA's rotation (and
    quack's), -1 is CODA v0.1's, (x, y) -> (x cos + y sin, -x sin + y cos). For each pair
    (2j, 2j+1) of the first `rotary_cols` columns the table holds (hi, lo) = the
    float-float split of direction * inv_freq[j] / (2 pi), i.e. the angle in turns to
    ~2^-49 relative; the last `passthrough_cols` columns (e.g. V of a fused QKV
    projection) get frequency 0, an exact identity."""
    trace.record("prepare", "rope_freq_table")
    if inv_freq.ndim != 1 or 2 * inv_freq.shape[0] != head_dim:
        raise ValueError(f"inv_freq must be ({head_dim // 2},), got {tuple(inv_freq.shape)}")
    if rotary_cols % head_dim or passthrough_cols % 2:
        raise ValueError("rotary_cols must be whole heads and passthrough_cols even")
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 or -1, got {direction!r}")
    turns = direction * inv_freq.double() / (2 * math.pi)
    hi = turns.float()
    lo = (turns - hi.double()).float()
    head = torch.stack((hi, lo), dim=-1).reshape(-1)
    table = head.repeat(rotary_cols // head_dim)
    return torch.cat((table, table.new_zeros(passthrough_cols))).contiguous()


@_helper
def qkv_rope_freq_table(inv_freq: torch.Tensor, d: int, direction: int = 1) -> torch.Tensor:
    """rope_freq_table for a fused QKV projection laid out [q | k | v], d columns each:
    q and k rotate (by direction * pos * inv_freq), v passes through."""
    trace.record("prepare", "qkv_rope_freq_table")
    return rope_freq_table(inv_freq, 2 * inv_freq.shape[0], rotary_cols=2 * d, passthrough_cols=d, direction=direction)
