"""The math an epilogue may use. Each function runs on torch tensors (the CPU emulator,
float32 like the GPU's accumulator) and on CuTe-DSL values while quack traces the kernel
(the GPU path imports quack lazily, so the emulator never pays for it).

All inputs and results are float32 values of one element (or one lane of a pair).
"""

from __future__ import annotations

import math as _math

import torch

from primitives.values import is_torch


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    if is_torch(x):
        return torch.sigmoid(x)
    from quack.activation import sigmoid as q

    return q(x)


def silu(x):
    """x * sigmoid(x) (SiLU, the gate activation of SwiGLU)."""
    if is_torch(x):
        return x * torch.sigmoid(x)
    from quack.activation import silu as q

    return q(x)


def swiglu(gate, up):
    """silu(gate) * up: one SwiGLU output from a (gate, up) pair."""
    if is_torch(gate, up):
        return gate * torch.sigmoid(gate) * up
    from quack.activation import swiglu as q

    return q(gate, up)


def dswiglu(gate, up, dout):
    """SwiGLU backward for out = silu(gate) * up given d_out:
    returns (d_gate, d_up, out), with s = sigmoid(gate),
    d_gate = dout * up * s * (1 + gate * (1 - s)), d_up = dout * silu(gate);
    `out` is recomputed for the down-projection's weight gradient."""
    if is_torch(gate, up, dout):
        s = torch.sigmoid(gate)
        silu_g = gate * s
        d_gate = dout * up * (s + silu_g * (1 - s))
        d_up = dout * silu_g
        return d_gate, d_up, silu_g * up
    from quack.activation import dswiglu as q

    return q(gate, up, dout)


def exp(x):
    """e**x (fast hardware exp on the GPU)."""
    if is_torch(x):
        return torch.exp(x)
    import cutlass.cute as cute

    return cute.math.exp(x, fastmath=True)


def log(x):
    """Natural logarithm."""
    if is_torch(x):
        return torch.log(x)
    import cutlass.cute as cute

    return cute.math.log(x, fastmath=True)


def rsqrt(x):
    """1 / sqrt(x)."""
    if is_torch(x):
        return torch.rsqrt(x)
    import cutlass.cute as cute

    return cute.math.rsqrt(x)


def fma(a, b, c):
    """a * b + c with one rounding (the float32 product is not rounded on its own)."""
    if is_torch(a, b, c):
        exact = torch.as_tensor(a, dtype=torch.float64) * torch.as_tensor(b, dtype=torch.float64)
        return (exact + torch.as_tensor(c, dtype=torch.float64)).to(torch.float32)
    import cutlass.cute as cute

    return cute.math.fma(a, b, c)


def rope_rotate(x1, x2, pos, freq):
    """Rotate one RoPE pair (x1, x2) by the angle pos * inv_freq:
    returns (x1 cos t - x2 sin t, x1 sin t + x2 cos t).

    `pos` is the row's position (a PerRow float32 operand). `freq` is the pair's lane of a
    PerCol float32 table built by `primitives.prepare.rope_freq_table`: in acc_pair mode
    it arrives as (hi, lo), the float-float split of inv_freq / (2 pi), so the angle is
    exact in turns even at large positions. Zero frequency is an exact identity, which is
    how V columns of a fused QKV projection pass through."""
    if is_torch(x1, x2):
        hi, lo = freq
        turns = pos.double() * (hi.double() + lo.double())
        turns = turns - torch.round(turns)
        angle = turns * (2 * _math.pi)
        c, s = torch.cos(angle).float(), torch.sin(angle).float()
        return x1 * c - x2 * s, x1 * s + x2 * c
    from quack.epilogue.rotary import _angle_turns, _sincos_turns

    s, c = _sincos_turns(*_angle_turns(pos, freq))
    return x1 * c - x2 * s, x1 * s + x2 * c
