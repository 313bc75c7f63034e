"""Run quack's own library epilogues (written by CODA's authors) through the contract.

`from_quack(mod)` turns a quack `EpiMod` into an `Epilogue`: its declarations are read
off the mod's ops, the GPU launches the mod itself, and the emulator calls a *torch twin*
of its function: the same code object with its math names (unpack, swiglu, cute.math.fma,
...) rebound to torch versions, recursively through the quack helpers it calls. Importing
quack costs ~10 s, so only kernels that wrap a library epilogue pay it, when first used.
"""

from __future__ import annotations

import types

import torch

from epiforge.primitives import math as pm
from epiforge.primitives.epilogue import Epilogue, EpilogueError
from epiforge.primitives.spec import (
    ColReduce,
    PerCol,
    PerRow,
    RowLogSumExp,
    RowReduce,
    RowSelect,
    Scalar,
    Tile,
)
from epiforge.primitives.values import TorchPair, pack, unpack

_QUACK_MODE = {"element": "element", "acc_pair": "acc_pair", "packed_cd_b16x2": "packed_pair"}
_COMBINE = {"add": "sum", "max": "max", "max_abs": "absmax"}


def from_quack(mod, operands: dict | None = None) -> Epilogue:
    """Wrap a quack EpiMod. `operands` declares the kinds of parameters quack would infer
    from tensor shapes (those the mod does not pin), e.g. {"y": Tile()}. Only a real one:
    anything else with the same fields (a namedtuple whose gemm does nothing) is refused,
    or a kernel could "compile" and "launch" nothing."""
    from quack.epilogue import ops as q
    from quack.epilogue.frontend import EpiMod

    if type(mod) is not EpiMod or not (getattr(mod.fn, "__module__", "") or "").startswith("quack.epilogue."):
        raise EpilogueError(f"from_quack: {type(mod).__name__} is not one of quack's own library epilogues")

    pinned = {
        q.ColVecLoad: PerRow,
        q.RowVecLoad: PerCol,
        q.Scalar: Scalar,
        q.TileLoad: Tile,
    }
    kinds = dict(operands or {})
    for p, op in mod.ops.items():
        kind = pinned.get(type(op))
        if kind is None:
            raise EpilogueError(f"from_quack: operand {p!r} uses {type(op).__name__}, which has no torch meaning here")
        kinds.setdefault(p, kind())
    reductions = {}
    for s, op in mod.sinks.items():
        if isinstance(op, q.OnlineLSEReduce):
            reductions[s] = RowLogSumExp()
        elif isinstance(op, q.ColVecSelect):
            reductions[s] = RowSelect(index=op.idx_op.name)
        elif isinstance(op, q.ColVecReduce):
            reductions[s] = RowReduce(_COMBINE[op.combine], product=op.scaled)
        elif isinstance(op, q.RowVecReduce):
            reductions[s] = ColReduce(_COMBINE[op.combine], product=op.scaled)
        else:
            raise EpilogueError(f"from_quack: sink {s!r} ({type(op).__name__}) has no torch meaning here")
    if mod.prepass is not None:
        raise EpilogueError("from_quack: epilogues with a prepass are not supported")
    companions = {id(r.idx_op) for r in mod.sinks.values() if isinstance(r, q.ColVecSelect)}
    if any(getattr(op, "quant", None) is not None for op in mod.output_ops.values()) or any(
        id(op) not in companions for op in mod.extra_ops
    ):
        raise EpilogueError("from_quack: quantized outputs and extra driver ops (SM100 or stochastic rounding) are not supported")
    epi = Epilogue(
        fn=mod.fn,
        outputs=tuple(mod.outputs),
        operands=kinds,
        reductions=reductions,
        mode=_QUACK_MODE[mod.mode],
        torch_fn=torch_twin(mod.fn),
        quack_mod=mod,
        author="quack library (CODA's authors)",
    )
    return epi


class LazyQuackEpilogue:
    """A quack library epilogue named by "module:name", imported on first use so that
    merely loading a kernel file stays cheap."""

    author = "quack library (CODA's authors)"

    def __init__(self, target: str, operands: dict | None = None):
        module, sep, attr = target.partition(":")
        if not sep or not module.startswith("quack."):
            raise EpilogueError(f"from_quack: expected 'quack.<module>:<name>', got {target!r}")
        self.target, self.name, self._operands, self._epi = target, attr, operands, None

    def resolve(self) -> Epilogue:
        if self._epi is None:
            import importlib

            module, _, attr = self.target.partition(":")
            if not module.startswith("quack.epilogue."):
                raise EpilogueError(f"from_quack: {self.target} is not in quack.epilogue")
            from epiforge.primitives.program import not_the_kernels

            with not_the_kernels():
                mod = getattr(importlib.import_module(module), attr, None)
            if mod is None:
                raise EpilogueError(f"from_quack: {self.target} does not exist in quack")
            self._epi = from_quack(mod, operands=self._operands)
            self._epi.library_target, self._epi.library_operands = self.target, self._operands
        return self._epi

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, attr):  # declarations, fn, ... of the resolved epilogue
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)


# ---- torch twins --------------------------------------------------------------------


class _CuteMathTwin:
    """The slice of cutlass.cute.math that library epilogues use, on torch tensors."""

    @staticmethod
    def fma(a, b, c, loc=None, ip=None):
        return pm.fma(a, b, c)

    @staticmethod
    def exp(x, fastmath=False, loc=None, ip=None):
        return torch.exp(x)

    @staticmethod
    def exp2(x, fastmath=False, loc=None, ip=None):
        return torch.exp2(x)

    @staticmethod
    def log(x, fastmath=False, loc=None, ip=None):
        return torch.log(x)

    @staticmethod
    def sin(x, fastmath=False, loc=None, ip=None):
        # the library's angle helpers pass float32 radians already reduced to [-pi, pi]
        return torch.sin(x.double()).float()

    @staticmethod
    def cos(x, fastmath=False, loc=None, ip=None):
        return torch.cos(x.double()).float()

    @staticmethod
    def rsqrt(x, fastmath=False, loc=None, ip=None):
        return torch.rsqrt(x)

    @staticmethod
    def sqrt(x, fastmath=False, loc=None, ip=None):
        return torch.sqrt(x)

    @staticmethod
    def tanh(x, fastmath=False, loc=None, ip=None):
        return torch.tanh(x)


class _CuteArchTwin:
    @staticmethod
    def fmax(a, b, abs=False, loc=None, ip=None):
        return torch.maximum(a.abs(), b.abs()) if abs else torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


class _Twins:
    """A namespace of twins that names what it lacks, instead of a bare AttributeError."""

    def __init__(self, prefix: str, cls):
        self._prefix, self._cls = prefix, cls

    def __getattr__(self, name):
        twin = getattr(self._cls, name, None)
        if twin is None:
            raise EpilogueError(f"this quack epilogue uses {self._prefix}.{name}, which has no torch twin "
                                "in primitives/quack_library.py: the emulator cannot run it")
        return twin


class _CuteTwin:
    math = _Twins("cute.math", _CuteMathTwin)
    arch = _Twins("cute.arch", _CuteArchTwin)


def _twin_table() -> dict[int, object]:
    """quack objects -> torch twins, keyed by identity (names vary across modules)."""
    import cutlass
    import cutlass.cute as cute
    import quack.activation as act
    import quack.epilogue.math as qmath

    table = {
        qmath.unpack: unpack,
        qmath.pack: pack,
        qmath.Pair: TorchPair,
        qmath.pexp: _dsl_op(torch.exp),
        qmath.pexp2: _dsl_op(torch.exp2),
        act.sigmoid: _dsl_op(pm.sigmoid),
        act.silu: _dsl_op(pm.silu),
        act.swiglu: _dsl_op(pm.swiglu),
        act.dswiglu: _dsl_op(pm.dswiglu),
        act.relu: _dsl_op(torch.relu),
        cute: _CuteTwin,
        cutlass.const_expr: lambda x: x,
        cutlass.Float32: lambda x: x,
    }
    return {id(k): v for k, v in table.items()}


def _dsl_op(fn):
    """A torch twin callable the way quack calls DSL ops (with loc= / ip= keywords)."""

    def op(*args, loc=None, ip=None, **kwargs):
        return fn(*args, **kwargs)

    return op


_TABLE: dict[int, object] | None = None


def torch_twin(fn, _done: dict | None = None):
    """The same function with every quack/CuTe name it reaches replaced by a torch twin."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _twin_table()
    done = {} if _done is None else _done
    if id(fn) in done:
        return done[id(fn)]
    glb = dict(fn.__globals__)
    cells = tuple(types.CellType() for _ in fn.__closure__ or ())
    twin = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, cells or None)
    twin.__kwdefaults__ = fn.__kwdefaults__
    done[id(fn)] = twin  # before recursing: helpers that reach each other must not loop
    for name in _code_names(fn.__code__):
        if name in glb:
            glb[name] = _twin_of(glb[name], done)
    for cell, orig in zip(cells, fn.__closure__ or ()):
        cell.cell_contents = _twin_of(orig.cell_contents, done)
    return twin


def _twin_of(obj, done):
    if id(obj) in _TABLE:
        return _TABLE[id(obj)]
    if isinstance(obj, types.ModuleType) and obj.__name__.startswith("cutlass"):
        # raw MLIR dialects and the like (e.g. arith.minnumf): no torch meaning
        return _Twins(obj.__name__.rsplit(".", 1)[-1], object)
    if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("quack."):
        # a DSL op (@dsl_user_op) wraps a plain Python function: twin that one
        return torch_twin(getattr(obj, "__wrapped__", obj), done)
    return obj


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names
