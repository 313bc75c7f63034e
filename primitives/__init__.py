"""The epilogue contract the LLM writes against (see primitive_docs/).

An epilogue is a plain function of the GEMM accumulator built from these names; the same
source runs on the GPU (quack's SM90 GEMM) and on the CPU (the tile emulator).

The modules:
- the contract: epilogue.py (@epilogue, the call), spec.py (operand kinds, reductions,
  modes), math.py (what a body may compute), values.py (pairs), config.py (tile configs),
  finish.py (finishing steps), prepare.py (one-time transforms of constants),
  quack_library.py (quack's own epilogues through the contract);
- its two meanings: emulator.py (the CPU), lowering.py (quack's SM90 GEMM; with
  pair_store.py, early_c.py, c_load_warp.py and quack_patch.py for what quack lacks) and
  finish_gpu.py (the finishing steps' kernels);
- kernels as data, for a judge whose launches no kernel code makes: graph.py (an
  epilogue's function as a graph of operations) and program.py (a kernel's calls described
  on shapes, run again by the primitives);
- trace.py: what the primitives did, for the evaluator.
"""

if __name__ != "epiforge.primitives":  # one copy only: the kernel-facing name is an alias
    raise ImportError(f"primitives was loaded as {__name__!r}: import epiforge first (it maps `import primitives` "
                      "to epiforge.primitives), or use `from epiforge import primitives`")


from epiforge.primitives import finish, prepare
from epiforge.primitives.config import DEFAULT_CONFIG, GemmConfig, pick_config
from epiforge.primitives.epilogue import Epilogue, EpilogueError, epilogue
from epiforge.primitives.math import (
    abs, dswiglu, erf, erfc, exp, fma, gelu, gelu_tanh, log, max, min, relu, rope_rotate, rsqrt, sigmoid, silu,
    squared_relu, swiglu, tanh, where,
)
from epiforge.primitives.spec import (
    ColReduce,
    HeadRMS,
    PerCol,
    PerRow,
    RowLogSumExp,
    RowReduce,
    RowSelect,
    Scalar,
    Tile,
    partials_shape,
)
from epiforge.primitives.values import pack, unpack


def from_quack(target, operands=None):
    """Wrap a quack library epilogue: an EpiMod, or a "module:name" path such as
    "quack.epilogue.library:swiglu_mod", resolved (importing quack, ~10 s) on first use."""
    from epiforge.primitives.quack_library import LazyQuackEpilogue, from_quack as _from_quack

    if isinstance(target, str):
        return LazyQuackEpilogue(target, operands)
    return _from_quack(target, operands=operands)


__all__ = [
    "ColReduce", "DEFAULT_CONFIG", "Epilogue", "EpilogueError", "GemmConfig", "HeadRMS", "PerCol",
    "PerRow", "RowLogSumExp", "RowReduce", "RowSelect", "Scalar", "Tile", "abs", "dswiglu",
    "epilogue", "erf", "erfc", "exp", "finish", "fma", "from_quack", "gelu", "gelu_tanh", "log", "max", "min", "pack",
    "partials_shape", "pick_config", "prepare", "relu", "rope_rotate", "rsqrt", "sigmoid", "silu", "squared_relu",
    "swiglu", "tanh", "unpack", "where",
]
