"""The math an epilogue may use. Each function runs on torch tensors (the CPU emulator,
float32 like the GPU's accumulator) and on CuTe-DSL values while quack traces the kernel
(the GPU path imports quack lazily, so the emulator never pays for it).

All inputs and results are float32 values of one element (or one lane of a pair).
"""

from __future__ import annotations

import math as _math

import torch

from epiforge.primitives.graph import traced
from epiforge.primitives.values import is_torch


@traced
def sigmoid(x):
    """1 / (1 + exp(-x))."""
    if is_torch(x):
        return torch.sigmoid(x)
    from quack.activation import sigmoid as q

    return q(x)


@traced
def silu(x):
    """x * sigmoid(x) (SiLU, the gate activation of SwiGLU)."""
    if is_torch(x):
        return x * torch.sigmoid(x)
    from quack.activation import silu as q

    return q(x)


@traced
def swiglu(gate, up):
    """silu(gate) * up: one SwiGLU output from a (gate, up) pair."""
    if is_torch(gate, up):
        return gate * torch.sigmoid(gate) * up
    from quack.activation import swiglu as q

    return q(gate, up)


@traced
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


@traced
def exp(x):
    """e**x (fast hardware exp on the GPU)."""
    if is_torch(x):
        return torch.exp(x)
    import cutlass.cute as cute

    return cute.math.exp(x, fastmath=True)


@traced
def log(x):
    """Natural logarithm."""
    if is_torch(x):
        return torch.log(x)
    import cutlass.cute as cute

    return cute.math.log(x, fastmath=True)


@traced
def rsqrt(x):
    """1 / sqrt(x)."""
    if is_torch(x):
        return torch.rsqrt(x)
    import cutlass.cute as cute

    return cute.math.rsqrt(x)


@traced
def fma(a, b, c):
    """a * b + c with one rounding (the float32 product is not rounded on its own)."""
    if is_torch(a, b, c):
        exact = torch.as_tensor(a, dtype=torch.float64) * torch.as_tensor(b, dtype=torch.float64)
        return (exact + torch.as_tensor(c, dtype=torch.float64)).to(torch.float32)
    import cutlass.cute as cute

    return cute.math.fma(a, b, c)


@traced
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


# ---- piecewise and transcendental math -------------------------------------------------
# Each has a torch meaning (the emulator) and an sm_90a one. Where torch propagates NaN
# (max, min, relu), so does the GPU side (IEEE maximum/minimum, not maxNum/minNum), so
# that the emulator and the GPU agree on every input. tanh and erf use the precise
# (not the fast approximate) instructions: the approximate tanh is off by ~2**-11.


def _float32(v):
    """A plain number as a DSL Float32 (a traced value passes through)."""
    from cutlass import Float32

    return v if isinstance(v, Float32) else Float32(v)


def _plain(*values) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


@traced
def max(a, b):  # noqa: A001 - P.max, as torch.maximum
    """The larger of a and b; NaN if either is NaN (torch.maximum)."""
    if is_torch(a, b) or _plain(a, b):
        return torch.maximum(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))
    import cutlass.cute as cute

    return cute.math.max(_float32(a), _float32(b), propagate_nan=True)


@traced
def min(a, b):  # noqa: A001 - P.min, as torch.minimum
    """The smaller of a and b; NaN if either is NaN (torch.minimum)."""
    if is_torch(a, b) or _plain(a, b):
        return torch.minimum(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))
    import cutlass.cute as cute

    return cute.math.min(_float32(a), _float32(b), propagate_nan=True)


@traced
def abs(x):  # noqa: A001 - P.abs, as torch.abs
    """|x|."""
    if is_torch(x):
        return torch.abs(x)
    import cutlass.cute as cute

    return cute.math.abs(_float32(x))


@traced
def relu(x):
    """max(x, 0); NaN stays NaN (torch.relu)."""
    return max(x, 0.0)


@traced
def squared_relu(x):
    """relu(x) ** 2 (Primer's squared ReLU)."""
    r = relu(x)
    return r * r


@traced
def tanh(x):
    """Hyperbolic tangent (the precise instruction sequence on the GPU, not tanh.approx)."""
    if is_torch(x):
        return torch.tanh(x)
    import cutlass.cute as cute

    return cute.math.tanh(_float32(x), fastmath=False)


@traced
def erf(x):
    """The error function, 2/sqrt(pi) * integral of exp(-t**2) from 0 to x."""
    if is_torch(x):
        return torch.erf(x)
    import cutlass.cute as cute

    return cute.math.erf(_float32(x), fastmath=False)


@traced
def erfc(x):
    """1 - erf(x), accurate where erf(x) is near 1 (no cancellation)."""
    if is_torch(x):
        return torch.erfc(x)
    import cutlass.cute as cute

    return cute.math.erfc(_float32(x), fastmath=False)


@traced
def gelu(x):
    """Exact GELU: x/2 * (1 + erf(x / sqrt(2))) (torch's approximate='none'), computed as
    x/2 * erfc(-x / sqrt(2)) so that the negative tail keeps its digits."""
    return 0.5 * x * erfc(x * (-1.0 / _math.sqrt(2.0)))


@traced
def gelu_tanh(x):
    """GELU's tanh form: x/2 * (1 + tanh(z)), z = sqrt(2/pi) * (x + 0.044715 x**3)
    (torch's approximate='tanh', GPT-2's), computed as x * sigmoid(2 z), the same value
    without the cancellation of 1 + tanh(z) at negative z."""
    z = _math.sqrt(2.0 / _math.pi) * (x + 0.044715 * (x * x * x))
    return x * sigmoid(2.0 * z)


@traced
def where(cond, a, b):
    """a where cond holds, else b. `cond` is one comparison of values (`acc > 0`,
    `x <= t`); a and b are values or numbers (torch.where)."""
    if is_torch(cond, a, b):
        if not (isinstance(cond, torch.Tensor) and cond.dtype == torch.bool):
            raise TypeError("P.where: the condition must be a comparison such as `acc > 0`")
        return torch.where(cond, torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32))
    from cutlass import Boolean
    from cutlass._mlir.dialects import arith

    from cutlass import Float32

    return Float32(arith.select(Boolean(cond).ir_value(), _float32(a).ir_value(), _float32(b).ir_value()))
