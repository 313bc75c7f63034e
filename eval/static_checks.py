"""Static (AST) rules for a candidate kernel, checked before anything of it runs.

The contract: a kernel computes only through `primitives` (the fused GEMM with its epilogue,
the task's named finishing steps, the prepare helpers). Its own code wires inputs to one
primitive call and names the outputs. The rules are an allowlist: whatever is not listed
below is rejected (STATIC_REJECTED), so a disguise nobody thought of fails closed. Each rule
closes a class of code (a binding form, a kind of value, a place), not a list of spellings.

Parsing
-------
size         a source over 256 KiB, a syntax tree nested deeper than 100 levels (measured
             with an explicit stack before any other rule runs), or a source the parser
             gives up on (its own nesting limits, RecursionError, MemoryError, ValueError)
             is one violation with one line. A plain syntax error is raised as SyntaxError
             (the caller reports a COMPILE_ERROR). `parse_bounded()` is that parser for
             other readers of kernel sources; it raises `SourceTooComplex` (a ValueError).
encoding     a PEP 263 declaration of an encoding other than UTF-8 (`coding_declaration`):
             the rules and the runner read the file as UTF-8, an import would not.

Where code runs
---------------
prepare scope   the top-level `def prepare`, and every plain def (top-level or nested) it
             reaches by direct calls such that every reference to that def anywhere in the
             file is a direct call (`helper(...)`, never a value) from a def in the scope.
             `run` is never in it; if `prepare` itself is referenced anywhere, there is no
             prepare scope; lambdas are never in it (they could outlive prepare()). It runs
             once per weight set and is not timed.
epilogue body   the body of a def decorated with @P.epilogue(...), and of every plain def
             called directly from an epilogue body ("epilogue helpers", transitively: they
             obey the same rules, so a helper cannot hide a type test).
ordinary     everything else: module level, run(), other helpers, lambdas.

What a kernel may use
---------------------
imports      `import primitives [as P]`, `from primitives import <public name>`,
             `from primitives.config import GemmConfig | DEFAULT_CONFIG | pick_config`,
             `import torch [as t]`, `from torch import <dtype | type | allocation>`,
             `import math`, `from math import ...`, `import typing` / `from typing import ...`,
             `from __future__ import annotations`. An imported name is never rebound.
primitives   P.<name> for every name in primitives.__all__ except `Epilogue` (building one by
             hand can give the CPU emulator a different function than the GPU compiles);
             P.finish.<finishing step> (primitives.finish.FINISHERS); P.prepare.<helper>.
             Data may be used as a value: P.DEFAULT_CONFIG, P.EpilogueError, P.GemmConfig and
             the declaration classes (PerRow PerCol Scalar Tile RowReduce ColReduce
             RowLogSumExp RowSelect). Every other primitives function is only ever called
             directly (`P.finish.row_sum(x)`, never `f = P.finish.row_sum`); P.epilogue only
             as the decorator `@P.epilogue(...)` of a def; P.from_quack only called directly
             outside every function and lambda, with one positional argument, a literal
             string from QUACK_EPILOGUES (quack 0.6.5's module-level epilogues of
             quack.epilogue.library and quack.epilogue.rotary), and at most `operands=`.
torch        values: dtypes (torch.bfloat16 ... torch.float8_e5m2) and types (torch.Tensor,
             torch.Size, torch.dtype, torch.device); called directly: allocation
             (torch.empty, empty_like, empty_strided, zeros, zeros_like, ones, ones_like,
             full, full_like), torch.finfo, torch.iinfo (and their fields read off the call:
             `torch.finfo(torch.float32).eps`). A filled allocation inside run() is
             a kernel launch: the launch check counts it. In the prepare scope also
             TORCH_PREPARE, called directly (stack cat matmul diag eye einsum sqrt sum ...:
             pure functions of tensors; nothing that loads, saves, compiles, seeds or draws
             random numbers, runs user code, changes global state or reaches
             cuda/backends/ops/library/hub/jit/utils).
math         any public name (it works on Python numbers, e.g. `1.0 / math.sqrt(d)`).
typing       any public name, inside annotations only (argument, return and variable
             annotations); a string annotation is never read.
on values    metadata: shape dtype device ndim T mT is_cuda layout itemsize nbytes size dim
             stride numel is_contiguous is_floating_point element_size storage_offset;
             views: view view_as reshape t transpose permute unsqueeze squeeze expand
             expand_as narrow select split chunk unbind flatten unflatten movedim swapaxes
             contiguous; allocation: new_empty new_zeros new_ones new_full; dict reads: get
             items keys values; GemmConfig fields: tile_m tile_n cluster_m cluster_n
             pingpong max_swizzle_size key. In the prepare scope also PREPARE_METHODS,
             called directly: casts (float double half bfloat16 to), clone detach, and
             out-of-place math (sum mean pow sqrt mul matmul diag repeat ...; never an
             in-place `_` method, nor one that reads raw memory).
builtins     abs all any bool callable dict divmod enumerate filter float format frozenset
             int isinstance len list map max min pow print range repr reversed round set
             slice sorted str sum tuple zip, and the common exception classes; annotations
             may also name any builtin type (object, type ...). A name bound inside a
             function, lambda or comprehension (a parameter or a local, e.g. `input`) may
             reuse a builtin's name: a local never falls back to the builtin.
operators    every Python operator; `@` only in the prepare scope. Elsewhere the launch
             check (GPU) or the compute guard (CPU) catches tensor arithmetic.
defaults     constant expressions only: numbers, strings, None, -1, 1 / 2, (1, 2), a
             module-level constant, a torch dtype or type, P.DEFAULT_CONFIG.
module-level constants  names bound exactly once, at module level, to an expression of
             number/string/bool/None constants, arithmetic, comparisons, and/or/not,
             math.pi/e/tau/inf/nan, math.<function>(...) and other module-level constants
             (`EPS = 1e-6`, `INV_SQRT2 = 1 / math.sqrt(2)`).

Epilogue bodies: traced once per element for sm_90a, run on whole stripes by the emulator
------------------------------------------------------------------------------------------
allowed      `x = ...` and tuple unpacking (`g, u = P.unpack(acc)`) into names, `return`,
             `pass`, a docstring; + - * / // % ** and unary - +; one comparison (== != < <=
             > >=); constants; tuple and dict displays (no `**`); the function's parameters
             and locals; module-level constants; math.pi e tau inf nan; values captured
             from an enclosing def (a number compiles, a tensor does not); calls of P.exp
             log rsqrt sigmoid silu swiglu dswiglu fma pack unpack rope_rotate abs max
             min relu squared_relu tanh erf erfc gelu gelu_tanh where (also as
             `from primitives import exp ...`) and of epilogue helpers, with `*` in their
             arguments; `if` and `x if c else y` whose condition uses only constants and
             module-level constants; `for i in range(<constants>)`.
rejected     everything else, among it: any builtin (isinstance type callable getattr
             hasattr id len max ...: a type test gives the emulator honest math and the
             sm_90a trace another); any attribute of a value (acc.clamp, acc.shape: the
             traced element has none of a tensor's); indexing (acc[:, :1] reads
             neighbours); `x += y` (in the emulator it changes the tensor in place, also
             under its other names); torch, and math functions (rule "epilogue" below);
             lambdas, nested defs, comprehensions, generator expressions, the walrus,
             f-strings, lists and sets, `**`, starred targets; imports; try with while del
             assert raise, for over anything but range(constants); conditions on values
             (`if acc > 0`, `and`/`or`/`not`, `is`, `in`, chained comparisons); calls of
             anything else (a captured function, a local, another epilogue); module-level
             names that are not constants (a module tensor, a list, a name bound twice).

What is rejected (rule names as they appear in messages)
--------------------------------------------------------
size         see Parsing.
import       any other import: os, sys, ctypes, gc, inspect, importlib, time, threading,
             subprocess, socket, torch.<submodule>, tasks, eval, quack, triton, cutlass,
             `from torch import <anything but a dtype, type or allocation>` ...
name         a name that is neither defined in the file nor an allowed builtin (open, exec,
             eval, compile, getattr, setattr, globals, vars, __import__, __builtins__ ...);
             a module-level binding of any builtin's name (a conditional one would fall back
             to the real builtin); rebinding an imported name anywhere (`P = ...`, a
             parameter named `torch`), or one name imported as two things; any __dunder__
             name (`__name__` may be read).
private      any attribute that starts with "_" (x.__class__, torch._C, P._anything).
introspection  attributes that reach interpreter internals without a leading "_", of any
             value, anywhere (INTROSPECTION_ATTRS, from the CPython data model): frames
             (f_back f_globals f_locals f_builtins f_code f_trace ...), code objects (co_code
             co_consts co_names ...), generators, coroutines and async generators (gi_frame
             gi_code gi_yieldfrom cr_frame cr_await ag_frame ...), tracebacks (tb_frame
             tb_next ...), cells (cell_contents), the Python 2 names (func_globals im_func
             ...), mro; and `match` statements (class patterns read attributes by name).
torch        torch.<anything else>: matmul, mm, einsum, cat (outside the prepare scope), nn,
             cuda (streams, events), ops, compile, load, save, manual_seed, randn, ...; a
             torch function used as a value (`z = torch.empty`); a module used as a plain
             value (`T = torch`).
primitives   a primitives name outside the public API (P.emulator, P.Epilogue, ...); a
             primitives function used as a value (`e = P.epilogue`, `f = P.finish.row_sum`);
             P.epilogue anywhere but as a decorator (`P.epilogue()(f)` too).
typing       a typing name used as a value or called (typing.get_type_hints, cast,
             ForwardRef, NamedTuple, TypedDict, NewType, TypeVar, get_args, get_origin ...,
             in any import style); a call, lambda, comprehension or any other computation
             inside an annotation (without `from __future__ import annotations` they are
             evaluated when the def runs).
method       an attribute of a value outside the list above (x.matmul, x.mm, x.sum, x.float,
             x.to, x.cpu, x.copy_, x.item, x.data_ptr, d.update, d.setdefault, ...); a
             prepare-scope method used as a value (`f = w.float`); any attribute of a value
             inside an epilogue body (acc.clamp).
matmul       the `@` and `@=` operators outside the prepare scope.
state        anything that keeps state between calls or writes where it must not:
             global/nonlocal; assigning or deleting an attribute; inside a function, a write
             through a subscript (`x[k] = v`, `x[k] += v`, `del x[k]`) or an augmented
             assignment of a name (`x += v`) unless x is a local ALL of whose bindings in
             that function are fresh values, and the write is one level deep (`x[k][j] = v`
             and `f()[k] = v` are rejected). Fresh: dict/list/set/tuple displays,
             comprehensions, constants, arithmetic and comparisons, calls of the builtins
             FRESH_BUILTINS (dict list set sorted zip ... but not min/max/sum, which may
             return an argument), torch allocation and the prepare scope's non-view torch
             math, x.new_*() and x.clone(), calls of primitives and of the file's epilogues,
             metadata (x.shape, x.shape[0], x.size(1)), another fresh local of the same
             function; `a or b` and `x if c else y` when every branch is. Not fresh:
             parameters (run()'s `prepared`), other names (module-level, closure), attributes,
             subscripts, calls of the file's own functions, min/max/sum,
             for/with/except/comprehension targets, the walrus, unpacking of anything but a
             display. Also: a for, with or comprehension target that writes through a
             subscript (`for C[k] in ...`, anywhere); any call with `out=` (it writes into an
             existing tensor) but to the builtin dict or a def of the file's own;
             `**kwargs` into a torch function or a method (it could carry out=); defaults
             that are not constants; decorators other than @P.epilogue(...); class
             definitions; generators (yield); a generator expression or a lazy iterator (map
             filter zip enumerate reversed) anywhere but where it is used up at once: a for
             or comprehension iterable, an argument of the builtins sum any all tuple list set
             frozenset sorted min max dict (or of a lazy iterator used up so), a `*`
             argument, the value of an unpacking assignment (a kept iterator is state
             between calls; a generator also carries a frame); async and await.
from_quack   P.from_quack anywhere but as allowed above: a non-literal or unknown target, a
             call inside a function or lambda, an alias (`fq = P.from_quack`), other
             arguments.
epilogue_body  what the epilogue-body allowlist above rejects.
epilogue     torch.<anything> or a math function inside an epilogue body: it cannot compile
             for sm_90a, so when it is the only problem it is reported as a COMPILE_ERROR.

The rules read only the source: a kernel cannot change them by what it does at run time.
Behind them, the worker checks what the rules cannot see (eval/guard.py, eval/numerics.py).
"""

from __future__ import annotations

import ast
import builtins
import io
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

MAX_SOURCE_BYTES = 256 * 1024
MAX_AST_DEPTH = 100

# ---- what a kernel may name ------------------------------------------------------------

PRIMITIVE_NAMES = frozenset({
    "ColReduce", "DEFAULT_CONFIG", "EpilogueError", "GemmConfig", "HeadRMS", "PerCol", "PerRow", "RowLogSumExp",
    "RowReduce", "RowSelect", "Scalar", "Tile", "dswiglu", "epilogue", "exp", "finish", "fma", "from_quack",
    "log", "pack", "partials_shape", "pick_config", "prepare", "rope_rotate", "rsqrt", "sigmoid", "silu",
    "swiglu", "unpack", "config", *"abs erf erfc gelu gelu_tanh max min relu squared_relu tanh where".split(),
})
PRIMITIVE_SUBMODULES = {
    "finish": frozenset({"rstd_from_sumsq", "row_sum", "col_sum", "cross_entropy", "rope_backward"}),  # + a task's own: see below
    "prepare": frozenset({"rope_freq_table", "qkv_rope_freq_table"}),
    "config": frozenset({"GemmConfig", "DEFAULT_CONFIG", "pick_config"}),
}
# usable as plain values: a config, an exception class, the config and declaration classes
PRIMITIVE_DATA = frozenset({
    "DEFAULT_CONFIG", "EpilogueError", "GemmConfig", "HeadRMS", "PerRow", "PerCol", "Scalar", "Tile", "RowReduce",
    "ColReduce", "RowLogSumExp", "RowSelect",
})
# the math an epilogue body may call (primitive_docs/math.md, pairs.md)
EPILOGUE_MATH = frozenset({
    "exp", "log", "rsqrt", "sigmoid", "silu", "swiglu", "dswiglu", "fma", "pack", "unpack", "rope_rotate",
    "abs", "erf", "erfc", "gelu", "gelu_tanh", "max", "min", "relu", "squared_relu", "tanh", "where",
})
TORCH_DTYPES = frozenset({
    "bfloat16", "float16", "half", "float32", "float", "float64", "double", "int8", "uint8", "int16",
    "int32", "int", "int64", "long", "bool", "float8_e4m3fn", "float8_e5m2",
})
TORCH_DATA = TORCH_DTYPES | {"dtype", "Tensor", "Size", "device"}
TORCH_ALLOC = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
})
TORCH_CALLABLES = TORCH_ALLOC | {"finfo", "iinfo"}
ALLOWED_TORCH = TORCH_DATA | TORCH_CALLABLES  # what `from torch import ...` may name
# prepare scope only, called directly. Vetted: pure functions of tensors and numbers that
# return tensors; none reads or writes files, seeds or draws random numbers, compiles, runs
# user code, changes global state or reaches torch.cuda/backends/ops/library/hub/jit/utils.
TORCH_PREPARE_VIEWS = frozenset({
    "transpose", "reshape", "flatten", "chunk", "split", "narrow", "t", "permute", "unsqueeze", "squeeze",
    "movedim", "broadcast_to",
})
TORCH_PREPARE = TORCH_PREPARE_VIEWS | {
    "stack", "cat", "concat", "concatenate", "hstack", "vstack", "arange", "linspace", "eye", "diag",
    "diag_embed", "tensor", "outer", "kron", "block_diag", "tril", "triu", "where", "flip", "roll",
    "repeat_interleave", "tile", "matmul", "mm", "mv", "einsum", "abs", "neg", "sqrt", "rsqrt", "exp", "log",
    "sin", "cos", "pow", "reciprocal", "square", "clamp", "maximum", "minimum", "sum", "mean", "cumsum",
    "prod", "amax", "amin", "sign",
}
VALUE_ATTRS = frozenset({
    # tensor metadata
    "shape", "dtype", "device", "ndim", "T", "mT", "is_cuda", "layout", "itemsize", "nbytes", "size", "dim",
    "stride", "numel", "is_contiguous", "is_floating_point", "element_size", "storage_offset",
    # views (and contiguous, for prepare(): inside run() a copy is a launch the checks count)
    "view", "view_as", "reshape", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
    "narrow", "select", "split", "chunk", "unbind", "flatten", "unflatten", "movedim", "swapaxes", "contiguous",
    # allocation
    "new_empty", "new_zeros", "new_ones", "new_full",
    # dict reads
    "get", "items", "keys", "values",
    # GemmConfig
    "tile_m", "tile_n", "cluster_m", "cluster_n", "pingpong", "max_swizzle_size", "key",
})
# the fields of torch.finfo(...) / torch.iinfo(...), read straight off the call
# (`torch.finfo(torch.float32).eps`); `max` and `min` nowhere else (on a tensor they reduce)
INFO_ATTRS = frozenset({"eps", "tiny", "smallest_normal", "resolution", "bits", "max", "min"})
# prepare scope only, called directly: casts, copies and out-of-place math (no in-place `_`
# methods, nothing that reads raw memory such as data_ptr, storage, as_strided, numpy)
PREPARE_METHODS = frozenset({
    "float", "double", "half", "bfloat16", "to", "clone", "detach",
    "sum", "mean", "pow", "sqrt", "rsqrt", "exp", "log", "abs", "neg", "reciprocal", "square", "clamp", "mul",
    "sub", "div", "matmul", "mm", "mv", "outer", "flip", "roll", "repeat", "repeat_interleave",
    "cumsum", "amax", "amin", "prod", "norm", "sin", "cos", "tril", "triu", "sign", "diag",
})  # not "add": set.add would write into a set
ALLOWED_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "dict", "divmod", "enumerate", "filter", "float", "format",
    "frozenset", "int", "isinstance", "len", "list", "map", "max", "min", "pow", "print", "range", "repr",
    "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip",
    "Exception", "ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "AssertionError",
    "NotImplementedError", "ArithmeticError", "ZeroDivisionError",
})
# builtins that consume an iterable before they return, and those that return a lazy iterator
CONSUMING_BUILTINS = frozenset({"sum", "any", "all", "tuple", "list", "set", "frozenset", "sorted", "min", "max", "dict"})
LAZY_BUILTINS = frozenset({"map", "filter", "zip", "enumerate", "reversed"})
# builtins whose result is a new object or an immutable value (min/max/sum may return an argument)
FRESH_BUILTINS = frozenset({
    "dict", "list", "set", "frozenset", "tuple", "sorted", "zip", "enumerate", "reversed", "range", "map",
    "filter", "str", "int", "float", "bool", "len", "repr", "format", "divmod", "round", "abs",
})
FRESH_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "clone"})
IMMUTABLE_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout", "itemsize", "nbytes"})
IMMUTABLE_METHODS = frozenset({
    "size", "stride", "dim", "numel", "element_size", "storage_offset", "is_contiguous", "is_floating_point",
})
# Attributes that reach interpreter internals without a leading "_" (the "_" ones are
# "private"), from the CPython data model ("The standard type hierarchy": frames, code
# objects, tracebacks, cells) and the inspect module's table (generators, coroutines,
# asynchronous generators); the Python 2 spellings of function and method attributes too.
INTROSPECTION_ATTRS = frozenset({
    # frame objects
    "f_back", "f_builtins", "f_code", "f_globals", "f_lasti", "f_lineno", "f_locals", "f_trace",
    "f_trace_lines", "f_trace_opcodes",
    # code objects
    "co_argcount", "co_cellvars", "co_code", "co_consts", "co_exceptiontable", "co_filename", "co_firstlineno",
    "co_flags", "co_freevars", "co_kwonlyargcount", "co_linetable", "co_lines", "co_lnotab", "co_name",
    "co_names", "co_nlocals", "co_positions", "co_posonlyargcount", "co_qualname", "co_stacksize",
    "co_varnames",
    # generators, coroutines, asynchronous generators
    "gi_code", "gi_frame", "gi_running", "gi_suspended", "gi_yieldfrom",
    "cr_await", "cr_code", "cr_frame", "cr_origin", "cr_running", "cr_suspended",
    "ag_await", "ag_code", "ag_frame", "ag_running",
    # tracebacks
    "tb_frame", "tb_lasti", "tb_lineno", "tb_next",
    # cells, Python 2 function and method attributes
    "cell_contents", "func_closure", "func_code", "func_defaults", "func_dict", "func_doc", "func_globals",
    "func_name", "im_class", "im_func", "im_self",
    # types
    "mro",
})
# quack 0.6.5's module-level epilogues (EpiMod objects) of quack.epilogue.library and
# quack.epilogue.rotary, read off .venv/lib/python3.11/site-packages/quack/epilogue/{library,
# rotary}.py (tests/eval/test_static_checks.py compares this set with the installed quack).
# Whether each one wraps is primitive_docs/quack_library.md's business; this set only
# bounds what the literal may name, so that from_quack never imports anything else.
QUACK_EPILOGUES = frozenset(
    [f"quack.epilogue.library:{n}" for n in (
        "amax_epi", "dgelu_dbias_epi", "dgelu_dbias_mod", "dgelu_ln_stats_epi", "dgelu_mod",
        "dswiglu_dpreact_mod", "dswiglu_mod", "dswiglu_moe_mod", "dswiglu_norm_mod", "dswiglu_oai_moe_mod",
        "dswiglu_rstd_preact_mod", "head_rmsnorm_epi", "identity_epi", "linear_epi", "ln_affine_epi",
        "ln_affine_gelu_epi", "ln_bwd_apply_epi", "ln_partial_epi", "lse_epi", "lse_partial_epi",
        "lse_target_epi", "norm_gelu", "norm_swiglu_mod", "qk_rope_epi", "qk_rope_ldg_epi", "qknorm_epi",
        "relu_mod", "relu_sq_mod", "residual_epi", "rms_bwd_apply_epi", "rms_bwd_apply_last_epi",
        "rms_bwd_entry_epi", "rms_bwd_partial_epi", "rms_fused", "rms_partial_epi", "rope_epi", "rstd_lse_epi",
        "rstd_swiglu_epi", "rstd_swiglu_preact_epi", "scaled_residual", "swiglu_mod", "swiglu_quant_mod",
    )]
    + [f"quack.epilogue.rotary:{n}" for n in (
        "mrope_posfreq_epi", "rope_posfreq_bias_epi", "rope_posfreq_epi", "rope_posfreq_scaled_epi",
        "rope_table_epi", "rope_table_ldg_epi", "rstd_rope_posfreq_epi", "xpos_posfreq_epi",
    )]
)
ALLOWED_MODULES = {"primitives", "primitives.config", "torch", "math", "typing", "__future__"}
MATH_CONSTANTS = frozenset({"pi", "e", "tau", "inf", "nan"})
_BUILTIN_NAMES = frozenset(dir(builtins))
_BUILTIN_TYPES = frozenset(n for n in _BUILTIN_NAMES if isinstance(getattr(builtins, n), type))  # annotations may name them
_PARSER_LIMITS = ("too many nested parentheses", "too many levels of indentation", "too many nested f-strings")


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} [{self.rule}]"


# ---- parsing ---------------------------------------------------------------------------


class SourceTooComplex(ValueError):
    """A source the checks refuse to analyse: over MAX_SOURCE_BYTES, nested deeper than
    MAX_AST_DEPTH, or one the parser itself gave up on. The message is one line."""

    def __init__(self, message: str, line: int = 1):
        super().__init__(message)
        self.line = line


def parse_bounded(source: str, filename: str = "<kernel>") -> ast.Module:
    """ast.parse with bounds, so that no source can exhaust the reader: raises
    SourceTooComplex for a source that is too large or too deeply nested (checked without
    recursion), SyntaxError for a plain syntax error."""
    if len(source) > MAX_SOURCE_BYTES or len(source.encode("utf-8", "surrogatepass")) > MAX_SOURCE_BYTES:
        raise SourceTooComplex(f"the source is over {MAX_SOURCE_BYTES // 1024} KiB")
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        if any(limit in str(e.msg) for limit in _PARSER_LIMITS):
            raise SourceTooComplex(f"the source is nested too deeply for the parser ({e.msg})", e.lineno or 1) from None
        raise
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:
        why = " ".join(str(e).split())[:120]
        raise SourceTooComplex(f"the parser gave up on the source ({type(e).__name__}{': ' + why if why else ''})") from None
    deep = _node_deeper_than(tree, MAX_AST_DEPTH)
    if deep is not None:
        line = getattr(deep, "lineno", 1)
        raise SourceTooComplex(f"the syntax tree is nested deeper than {MAX_AST_DEPTH} levels (at line {line})", line)
    return tree


def _node_deeper_than(tree: ast.AST, limit: int) -> ast.AST | None:
    """The first node found below `limit` levels, walking with an explicit stack."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)):
                stack.append((child, depth + 1))
    return None


def coding_declaration(source: str) -> Violation | None:
    """A PEP 263 encoding declaration other than UTF-8's, as Python's own reader finds it
    (tokenize.detect_encoding). The checks read a kernel as UTF-8 text, and so does the
    runner, which compiles that very text (eval/kernel.py load_kernel_module; a declaration
    in a str is ignored). An import of the file would decode it by the declaration instead:
    in UTF-7 `#+AAo-` is a newline, so what the rules took for one comment would be
    statements. Refused, so that a kernel means the same to every reader."""
    read = io.BytesIO(source.encode("utf-8", "surrogatepass")).readline
    try:
        encoding, lines = tokenize.detect_encoding(read)
    except SyntaxError as e:  # an unknown encoding, or one at odds with a BOM
        return Violation("encoding", e.lineno or 1, f"{e.msg}: a kernel is UTF-8 and read as such; remove the declaration")
    if encoding in ("utf-8", "utf-8-sig"):
        return None
    return Violation("encoding", max(len(lines), 1), f"the file declares the encoding {encoding!r}: a kernel is "
                                                     "UTF-8 and read as such; remove the declaration")


def check_source(source: str, filename: str = "<kernel>") -> list[Violation]:
    """Every rule violation in a kernel's source (empty: it may run). A syntax error is
    raised as SyntaxError (the caller reports it as a compile error); nothing else is."""
    try:
        tree = parse_bounded(source, filename)
    except SourceTooComplex as e:
        return [Violation("size", e.line, str(e))]
    coding = coding_declaration(source)
    try:
        return ([coding] if coding else []) + _Checker(tree).run()
    except RecursionError:  # only reachable when the caller's own stack is nearly full
        return [Violation("size", 1, "the source is too complex to check")]


def check_file(path) -> list[Violation]:
    p = Path(path)
    return check_source(p.read_bytes().decode(errors="replace"), str(p))


def only_compile_errors(violations: list[Violation]) -> bool:
    """True when every violation is torch (or math) code inside an epilogue body: it cannot
    compile for the GPU, which is what the kernel's author needs to hear (COMPILE_ERROR)."""
    return bool(violations) and all(v.rule == "epilogue" for v in violations)


def summarize(violations: list[Violation], limit: int = 3) -> str:
    """One line for a Result message."""
    head = "; ".join(str(v) for v in violations[:limit])
    more = f" (+{len(violations) - limit} more)" if len(violations) > limit else ""
    return f"static checks: {head}{more}"


# ---- scopes: which names each function binds, and to what ------------------------------


@dataclass(frozen=True, eq=False)
class _Binding:
    kind: str  # value | parameter | target | import | def | class | augmented | annotation | del
    node: ast.AST  # the bound value (value), the def, the alias, or the binding node itself


@dataclass(eq=False)
class _Scope:
    node: ast.AST  # Module, FunctionDef, Lambda, ClassDef or a comprehension
    parent: _Scope | None
    bindings: dict[str, list[_Binding]] = field(default_factory=dict)

    def bind(self, name: str, kind: str, node: ast.AST) -> None:
        self.bindings.setdefault(name, []).append(_Binding(kind, node))

    def resolve(self, name: str) -> _Scope | None:
        """The scope a name read here refers to; None: a builtin or undefined."""
        scope = self
        while scope is not None:
            if name in scope.bindings:
                return scope
            scope = scope.parent
        return None

    def function(self) -> _Scope:
        """The nearest enclosing function, lambda or module scope (comprehensions are
        transparent: they run at once, inside it)."""
        scope = self
        while isinstance(scope.node, _COMPREHENSIONS):
            scope = scope.parent
        return scope


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_COLLECTED = (ast.Call, ast.Name, ast.Import, ast.ImportFrom, ast.FunctionDef)


class _Scopes(ast.NodeVisitor):
    """Builds the scope tree with Python's rules and records, for every node, the scope in
    which it is evaluated."""

    def __init__(self, tree: ast.Module):
        self.module = _Scope(tree, None)
        self.scope = self.module
        self.at: dict[int, _Scope] = {}
        self.found: dict[type, list] = {t: [] for t in _COLLECTED}  # the nodes the checker looks up, in one pass
        self.visit(tree)

    def of(self, node: ast.AST) -> _Scope:
        return self.at.get(id(node), self.module)

    def visit(self, node):
        self.at[id(node)] = self.scope
        if isinstance(node, _COLLECTED):
            self.found[type(node)].append(node)
        super().visit(node)

    def inside(self, node: ast.AST, outer: ast.AST) -> bool:
        """Whether a node is evaluated inside the scope of `outer` (a def)."""
        scope = self.of(node)
        while scope is not None and scope.node is not outer:
            scope = scope.parent
        return scope is not None

    def _inside(self, node, body) -> None:
        outer, self.scope = self.scope, _Scope(node, self.scope)
        try:
            body()
        finally:
            self.scope = outer

    def _bind_arguments(self, args: ast.arguments) -> None:
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                self.scope.bind(a.arg, "parameter", a)
                self.at[id(a)] = self.scope

    def _visit_outside(self, args: ast.arguments, returns=None) -> None:
        for d in [*args.defaults, *args.kw_defaults]:
            if d is not None:
                self.visit(d)
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                self.visit(a.annotation)
        if returns is not None:
            self.visit(returns)

    def visit_FunctionDef(self, node):
        self.scope.bind(node.name, "def", node)
        for d in node.decorator_list:
            self.visit(d)
        self._visit_outside(node.args, node.returns)
        self._inside(node, lambda: (self._bind_arguments(node.args), [self.visit(s) for s in node.body]))

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._visit_outside(node.args)
        self._inside(node, lambda: (self._bind_arguments(node.args), self.visit(node.body)))

    def visit_ClassDef(self, node):
        self.scope.bind(node.name, "class", node)
        for n in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(n)
        self._inside(node, lambda: [self.visit(s) for s in node.body])

    def _comprehension(self, node, *elts):
        first = node.generators[0]
        self.visit(first.iter)  # evaluated in the enclosing scope

        def inner():
            for i, gen in enumerate(node.generators):
                if i:
                    self.visit(gen.iter)
                self._bind_target(gen.target, None)
                self.visit(gen.target)
                for cond in gen.ifs:
                    self.visit(cond)
            for e in elts:
                self.visit(e)

        self._inside(node, inner)

    def visit_ListComp(self, node):
        self._comprehension(node, node.elt)

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, node.key, node.value)

    def _bind_target(self, target, value) -> None:
        """Bind the names of an assignment target; `value` is the expression each name gets
        when it is known (None: an unpacked, iterated or otherwise unknown value)."""
        if isinstance(target, ast.Name):
            self.scope.bind(target.id, "value" if value is not None else "target", value if value is not None else target)
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairwise = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                        and not any(isinstance(e, ast.Starred) for e in [*value.elts, *target.elts]))
            for i, t in enumerate(target.elts):
                self._bind_target(t, value.elts[i] if pairwise else None)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)

    def visit_Assign(self, node):
        for t in node.targets:
            self._bind_target(t, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self.scope.bind(node.target.id, "augmented", node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if isinstance(node.target, ast.Name):
            if node.value is not None:
                self.scope.bind(node.target.id, "value", node.value)
            else:
                self.scope.bind(node.target.id, "annotation", node)
        self.generic_visit(node)

    def visit_For(self, node):
        self._bind_target(node.target, None)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_withitem(self, node):
        if node.optional_vars is not None:
            self._bind_target(node.optional_vars, None)
        self.generic_visit(node)

    def visit_ExceptHandler(self, node):
        if node.name:
            self.scope.bind(node.name, "target", node)
        self.generic_visit(node)

    def visit_Import(self, node):
        for a in node.names:
            self.scope.bind((a.asname or a.name).split(".")[0], "import", a)

    visit_ImportFrom = visit_Import

    def visit_NamedExpr(self, node):
        self.scope.function().bind(node.target.id, "target", node)
        self.visit(node.value)
        self.at[id(node.target)] = self.scope

    def visit_Delete(self, node):
        for t in node.targets:
            if isinstance(t, ast.Name):
                self.scope.bind(t.id, "del", t)
        self.generic_visit(node)

    def visit_MatchAs(self, node):
        if node.name:
            self.scope.bind(node.name, "target", node)
        self.generic_visit(node)

    def visit_MatchStar(self, node):
        if node.name:
            self.scope.bind(node.name, "target", node)

    def visit_MatchMapping(self, node):
        if node.rest:
            self.scope.bind(node.rest, "target", node)
        self.generic_visit(node)


# ---- the checker -----------------------------------------------------------------------

_EPILOGUE_NODES = (
    ast.Assign, ast.AnnAssign, ast.Return, ast.If, ast.For, ast.Pass, ast.Expr,
    ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Tuple, ast.Dict,
    ast.Call, ast.Attribute, ast.Starred, ast.keyword, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop,
)
_EPILOGUE_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_ANNOTATION_NODES = (
    ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.Tuple, ast.List, ast.BinOp, ast.BitOr,
    ast.expr_context,
)
_WHAT = {
    ast.Lambda: "a lambda", ast.FunctionDef: "a nested function", ast.AsyncFunctionDef: "a nested function",
    ast.ClassDef: "a class", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression", ast.NamedExpr: "the walrus operator",
    ast.Subscript: "indexing", ast.Slice: "a slice", ast.Try: "try", ast.With: "with", ast.While: "while",
    ast.Import: "an import", ast.ImportFrom: "an import", ast.JoinedStr: "an f-string", ast.List: "a list",
    ast.Set: "a set", ast.BoolOp: "and/or", ast.Delete: "del", ast.Assert: "assert", ast.Raise: "raise",
    ast.Global: "global", ast.Nonlocal: "nonlocal", ast.Await: "await", ast.Yield: "yield",
    ast.YieldFrom: "yield", ast.Call: "a call",
    ast.AugAssign: "an augmented assignment (x += y: in the emulator it changes the tensor in place, also under its "
                   "other names; write x = x + y)",
}


def _what(node) -> str:
    return _WHAT.get(type(node), type(node).__name__)


def _submodule_names(sub: str):
    """What a kernel may call in P.<sub>: for finish, every registered finishing step (a
    task's own finishing.py registers its steps when the task loads, which is before its
    kernels are checked); read from primitives.finish where it is loaded, so that the checker
    itself imports no torch."""
    mod = sys.modules.get("epiforge.primitives.finish") if sub == "finish" else None
    return mod.FINISHERS if mod is not None else PRIMITIVE_SUBMODULES[sub]


def _kind(path: str) -> str | None:
    """What a dotted name reached through an import is: module, data (a value), call
    (called directly), prepare_call (torch math, prepare scope only), math_call,
    decorator (P.epilogue), from_quack, typing (annotations only), future; None: not
    allowed."""
    parts = path.split(".")
    root, n = parts[0], len(parts)
    if root == "torch":
        if n == 1:
            return "module"
        if n == 2 and parts[1] in TORCH_DATA:
            return "data"
        if n == 2 and parts[1] in TORCH_CALLABLES:
            return "call"
        if n == 2 and parts[1] in TORCH_PREPARE:
            return "prepare_call"
        return None
    if root == "primitives":
        if n == 3 and parts[1] == "config" and parts[2] in PRIMITIVE_SUBMODULES["config"]:
            parts, n = ["primitives", parts[2]], 2
        if n == 1 or (n == 2 and parts[1] in PRIMITIVE_SUBMODULES):
            return "module"
        if n == 2 and parts[1] == "epilogue":
            return "decorator"
        if n == 2 and parts[1] == "from_quack":
            return "from_quack"
        if n == 2 and parts[1] in PRIMITIVE_DATA:
            return "data"
        if n == 2 and parts[1] in PRIMITIVE_NAMES:
            return "call"
        if n == 3 and parts[1] in PRIMITIVE_SUBMODULES and parts[2] in _submodule_names(parts[1]):
            return "call"
        return None
    if root == "math":
        if n == 1:
            return "module"
        if n == 2 and not parts[1].startswith("_"):
            return "data" if parts[1] in MATH_CONSTANTS else "math_call"
        return None
    if root == "typing":
        return "module" if n == 1 else "typing" if n == 2 else None
    if root == "__future__":
        return "future"
    return None


def _rule_for(path: str) -> str:
    root = path.split(".")[0]
    return {"torch": "torch", "primitives": "primitives", "typing": "typing"}.get(root, "import")


class _Checker(ast.NodeVisitor):
    """The rules, in one visit after a few pre-passes (imports, bindings, module-level
    constants, who calls whom); each visit_* judges one kind of node in its context: an
    epilogue body, the prepare scope, an annotation, or ordinary code."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.out: list[Violation] = []
        self.scopes = _Scopes(tree)
        self.callees = {id(n.func) for n in self.scopes.found[ast.Call]}
        self.imports: dict[str, str] = {}  # local name -> dotted path of the imported module or object
        self.allowed_calls: set[int] = set()  # callee nodes already judged (from_quack, decorators)
        self.consumed: set[int] = set()  # generator expressions and lazy iterators consumed where they stand
        self.fresh: dict[tuple[int, str], bool] = {}  # (function scope, local) -> every binding is fresh
        # the context of the node being visited
        self.epilogue: ast.AST | None = None  # the epilogue (or epilogue helper) def whose body this is
        self.epilogue_label = ""
        self.in_prepare = False
        self.in_annotation = False

    def bad(self, node, rule: str, message: str) -> None:
        self.out.append(Violation(rule, getattr(node, "lineno", 0) or 0, message))

    def run(self) -> list[Violation]:
        self._collect_imports()
        self._check_bindings()
        self.constants = self._module_constants()
        self.epilogue_defs = {n for n in self.scopes.found[ast.FunctionDef]
                              if any(self._is_epilogue_decorator(d) for d in n.decorator_list)}
        references = self._references()
        self.helpers = self._epilogue_helpers(references)
        self.prepare_scope = self._prepare_scope(references)
        self.visit(self.tree)
        return sorted(set(self.out), key=lambda v: (v.line, v.rule, v.message))

    # ---- what the file binds -------------------------------------------------------

    def _collect_imports(self) -> None:
        """Validate every import and record what each local name it binds refers to."""
        for node in [*self.scopes.found[ast.Import], *self.scopes.found[ast.ImportFrom]]:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name not in ALLOWED_MODULES or a.name == "primitives.config":
                        self.bad(node, "import", f"import {a.name} is not allowed (allowed: primitives, torch, math, typing)")
                    elif "." in a.name and not a.asname:
                        self.bad(node, "import", f"import {a.name} without 'as'")
                    else:
                        self._import(node, a.asname or a.name, a.name)
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level or mod not in ALLOWED_MODULES:
                    self.bad(node, "import", f"from {'.' * node.level}{mod} import ... is not allowed")
                    continue
                for a in node.names:
                    path = f"{mod}.{a.name}"
                    if a.name == "*":
                        self.bad(node, "import", f"from {mod} import * is not allowed")
                    elif a.name.startswith("_") and mod != "__future__":
                        self.bad(node, "private", f"from {mod} import {a.name}")
                    elif mod == "torch" and a.name not in ALLOWED_TORCH:
                        self.bad(node, "import", f"from torch import {a.name} is not allowed")
                    elif mod.startswith("primitives") and _kind(path) is None:
                        self.bad(node, "primitives", f"from {mod} import {a.name} is not allowed")
                    else:
                        self._import(node, a.asname or a.name, path)

    def _import(self, node, name: str, path: str) -> None:
        if self.imports.get(name, path) != path:
            self.bad(node, "name", f"{name!r} is imported twice, as {self.imports[name]} and as {path}")
        self.imports.setdefault(name, path)

    def _all_scopes(self) -> list[_Scope]:
        seen, out = set(), []
        for scope in self.scopes.at.values():
            if id(scope) not in seen:
                seen.add(id(scope))
                out.append(scope)
        return out

    def _check_bindings(self) -> None:
        """Dunder names, module-level builtin names and rebound imports, wherever bound."""
        for scope in self._all_scopes():
            for name, bindings in scope.bindings.items():
                for b in bindings:
                    if name.startswith("__") and name.endswith("__"):
                        self.bad(b.node, "name", f"dunder name {name!r}")
                    elif name in self.imports and b.kind != "import":
                        self.bad(b.node, "name", f"binding {name!r} shadows the imported {self.imports[name]}")
                    elif scope is self.scopes.module and name in _BUILTIN_NAMES and b.kind != "import":
                        self.bad(b.node, "name", f"binding {name!r} at module level shadows the builtin of that name "
                                                 "(a conditional binding would fall back to the real builtin)")

    def _module_constants(self) -> set[str]:
        """Module-level names bound exactly once, to a constant expression (which may use
        other such names: resolved in dependency order, without recursion)."""
        module = self.scopes.module
        needs: dict[str, set[str]] = {}
        for name, bindings in module.bindings.items():
            if len(bindings) == 1 and bindings[0].kind == "value":
                names = self._constant_names(bindings[0].node)
                if names is not None:
                    needs[name] = names
        waiting = {name: len(names) for name, names in needs.items()}
        users: dict[str, list[str]] = {}
        for name, names in needs.items():
            for n in names:
                users.setdefault(n, []).append(name)
        constants, ready = set(), [name for name, count in waiting.items() if count == 0]
        while ready:
            name = ready.pop()
            constants.add(name)
            for user in users.get(name, []):
                waiting[user] -= 1
                if waiting[user] == 0:
                    ready.append(user)
        return constants

    def _constant_names(self, node) -> set[str] | None:
        """If the expression is built only from constants, arithmetic, math.<constant> and
        math.<function>(...) calls and module-level names, the names it uses; else None."""
        names: set[str] = set()
        todo = [node]
        while todo:
            n = todo.pop()
            if isinstance(n, ast.Constant):
                if not isinstance(n.value, (int, float, str, bool, type(None))):
                    return None
            elif isinstance(n, ast.UnaryOp):
                todo.append(n.operand)
            elif isinstance(n, ast.BinOp) and not isinstance(n.op, ast.MatMult):
                todo += [n.left, n.right]
            elif isinstance(n, ast.BoolOp):
                todo += n.values
            elif isinstance(n, ast.Compare):
                todo += [n.left, *n.comparators]
            elif isinstance(n, ast.Name) and n.id not in self.imports:
                if self.scopes.of(n).resolve(n.id) is not self.scopes.module:
                    return None
                names.add(n.id)
            elif self._path(n) is not None:
                if not (self._path(n).startswith("math.") and _kind(self._path(n)) == "data"):
                    return None
            elif isinstance(n, ast.Call) and not n.keywords and self._path(n.func) is not None:
                if _kind(self._path(n.func)) != "math_call" or any(isinstance(a, ast.Starred) for a in n.args):
                    return None
                todo += n.args
            else:
                return None
        return names

    def _is_constant_expr(self, node, constants) -> bool:
        names = self._constant_names(node)
        return names is not None and names <= constants

    def _is_python_constant(self, node) -> bool:
        """An expression of constants and module-level constants only (an epilogue's
        `if` may branch on it: it is the same in the emulator and in the trace)."""
        return self._is_constant_expr(node, self.constants)

    def _is_epilogue_decorator(self, dec) -> bool:
        return isinstance(dec, ast.Call) and self._path(dec.func) == "primitives.epilogue"

    def _path(self, node) -> str | None:
        """torch.x.y -> 'torch.x.y' when the chain starts at an imported name."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.imports:
            return ".".join([self.imports[node.id], *reversed(parts)])
        return None

    def _single_def(self, name_node: ast.Name) -> ast.FunctionDef | None:
        """The def a name refers to, when that def is the name's only binding."""
        owner = self.scopes.of(name_node).resolve(name_node.id)
        if owner is None:
            return None
        bindings = owner.bindings[name_node.id]
        if len(bindings) == 1 and bindings[0].kind == "def" and isinstance(bindings[0].node, ast.FunctionDef):
            return bindings[0].node
        return None

    # ---- who calls whom: epilogue helpers and the prepare scope --------------------

    def _references(self) -> dict[ast.FunctionDef, list[tuple[ast.AST | None, bool]]]:
        """For every def referenced by name: (the def or None (module level, a lambda) in
        which the reference is evaluated, whether it is a direct call)."""
        refs: dict[ast.FunctionDef, list[tuple[ast.AST | None, bool]]] = {}
        for node in self.scopes.found[ast.Name]:
            if isinstance(node.ctx, ast.Load):
                target = self._single_def(node)
                if target is not None:
                    where = self.scopes.of(node).function().node
                    refs.setdefault(target, []).append(
                        (where if isinstance(where, ast.FunctionDef) else None, id(node) in self.callees))
        return refs

    @staticmethod
    def _calls_from(references) -> tuple[dict, dict]:
        """Who each def references (any way), and whom it calls directly."""
        referenced, called = {}, {}
        for target, refs in references.items():
            for where, direct in refs:
                referenced.setdefault(where, set()).add(target)
                if direct:
                    called.setdefault(where, set()).add(target)
        return referenced, called

    def _epilogue_helpers(self, references) -> dict[ast.FunctionDef, str]:
        """Plain defs called directly from an epilogue body (or from another helper)."""
        _, called = self._calls_from(references)
        helpers: dict[ast.FunctionDef, str] = {}
        todo = [(f, f"epilogue {f.name}()") for f in self.epilogue_defs]
        while todo:
            caller, label = todo.pop()
            for f in called.get(caller, ()):
                if f not in helpers and f not in self.epilogue_defs and not f.decorator_list:
                    helpers[f] = f"{f.name}() (a helper of {label})"
                    todo.append((f, f"{f.name}()"))
        return helpers

    def _prepare_scope(self, references) -> set[ast.FunctionDef]:
        """prepare() and the plain defs it reaches by direct calls, where every reference
        to each of them is a direct call from a def that is itself in the scope."""
        bindings = self.scopes.module.bindings.get("prepare", [])
        if len(bindings) != 1 or bindings[0].kind != "def" or bindings[0].node.decorator_list:
            return set()
        root = bindings[0].node
        run = {b.node for b in self.scopes.module.bindings.get("run", [])}  # the evaluator calls run() too
        candidates = {f for f in references if not f.decorator_list and f not in self.helpers and f not in run}
        candidates |= {n for n in self.scopes.found[ast.FunctionDef] if not n.decorator_list and self.scopes.inside(n, root)}
        candidates.add(root)
        referenced, called = self._calls_from(references)
        outside = {f for f in candidates
                   if any(not direct or where not in candidates for where, direct in references.get(f, []))}
        todo = list(outside)
        while todo:  # what an outside def references is referenced from outside
            for f in referenced.get(todo.pop(), ()):
                if f in candidates and f not in outside:
                    outside.add(f)
                    todo.append(f)
        if root in outside:
            return set()
        scope, todo = {root}, [root]
        while todo:  # only what prepare() reaches
            for f in called.get(todo.pop(), ()):
                if f in candidates and f not in outside and f not in scope:
                    scope.add(f)
                    todo.append(f)
        return scope

    # ---- the visit -----------------------------------------------------------------

    def visit(self, node):
        if self.epilogue is not None and not isinstance(node, _EPILOGUE_NODES):
            self.bad(node, "epilogue_body", f"{_what(node)} inside {self.epilogue_label}: an epilogue body is plain "
                                            "arithmetic of its parameters (see the rule book)")
            return
        if self.in_annotation and not isinstance(node, _ANNOTATION_NODES):
            self.bad(node, "typing", f"{_what(node)} in an annotation: annotations may only name types")
            for child in ast.iter_child_nodes(node):  # and name what it computes with (getattr ...)
                child = child.value if isinstance(child, ast.keyword) else child
                if isinstance(child, ast.expr):
                    self.visit(child)
            return
        super().visit(node)

    def _visit_annotation(self, node) -> None:
        if node is None:
            return
        outer = (self.epilogue, self.in_annotation)
        self.epilogue, self.in_annotation = None, True
        try:
            self.visit(node)
        finally:
            self.epilogue, self.in_annotation = outer

    # ---- names ---------------------------------------------------------------------

    def visit_Name(self, node: ast.Name) -> None:
        n = node.id
        if n.startswith("__") and n.endswith("__"):
            if not (n == "__name__" and isinstance(node.ctx, ast.Load)):
                self.bad(node, "name", f"dunder name {n!r}")
            return
        if not isinstance(node.ctx, ast.Load):
            return
        if n in self.imports:
            self._judge_path(self.imports[n], node)
            return
        owner = self.scopes.of(node).resolve(n)
        if self.epilogue is not None:
            self._epilogue_name(node, owner)
        elif owner is None and n not in ALLOWED_BUILTINS and not (self.in_annotation and n in _BUILTIN_TYPES):
            what = "a builtin outside the allowlist" if n in _BUILTIN_NAMES else "not defined in the kernel"
            self.bad(node, "name", f"{n!r} is {what}")

    def _epilogue_name(self, node: ast.Name, owner: _Scope | None) -> None:
        n = node.id
        if owner is not None and owner.node is self.epilogue:
            return  # a parameter or a local
        if owner is self.scopes.module and n in self.constants:
            return
        if owner is not None and owner is not self.scopes.module and id(node) not in self.callees:
            return  # a value captured from an enclosing function (a number compiles; a tensor does not)
        target = self._single_def(node)
        if target in self.helpers and id(node) in self.callees:
            return
        if owner is None and n in _BUILTIN_NAMES:
            self.bad(node, "epilogue_body", f"the builtin {n}() inside {self.epilogue_label}: a builtin (a type test, "
                                            "len, max ...) can give the emulator and the sm_90a trace different math")
        else:
            self.bad(node, "epilogue_body", f"{n!r} inside {self.epilogue_label}: only its parameters and locals, "
                                            "module-level constants, the primitives' math and epilogue helpers may be named")

    # ---- dotted names through imports ------------------------------------------------

    def _judge_path(self, path: str, node) -> None:
        """A name reached through an import, judged once at its outermost attribute."""
        kind = _kind(path)
        direct = id(node) in self.callees
        root, last = path.split(".")[0], path.split(".")[-1]
        if self.epilogue is not None:
            if (root == "primitives" and kind == "call" and last in EPILOGUE_MATH and direct) or (root == "math" and kind == "data"):
                return  # the primitives' math, or math.pi (a number)
            if root in ("torch", "math"):
                self.bad(node, "epilogue", f"{path} inside {self.epilogue_label}: the function is traced for sm_90a, "
                                           "where only arithmetic and the primitives' math compile (P.sigmoid, P.exp ...)")
            else:
                self.bad(node, "epilogue_body", f"{path} inside {self.epilogue_label}: only the primitives' math "
                                                "(P.exp, P.unpack ...) may be used there, and only called")
            return
        if kind is None:
            why = {"torch": ": a kernel computes only through primitives",
                   "primitives": ": not part of the primitives' public API"}.get(_rule_for(path), "")
            self.bad(node, _rule_for(path), f"{path} is not allowed{why}")
        elif self.in_annotation:
            if kind in ("module", "future"):
                self.bad(node, _rule_for(path), f"module {path} in an annotation")
        elif kind == "module":
            self.bad(node, "torch" if root == "torch" else "typing" if root == "typing" else "primitives",
                     f"module {path!r} used as a value; only {path}.<allowed name> may be used")
        elif kind == "typing":
            self.bad(node, "typing", f"{path} used as a value: names from typing may appear only inside annotations")
        elif kind == "future":
            self.bad(node, "name", f"{path} used as a value")
        elif kind == "decorator":
            if id(node) not in self.allowed_calls:
                self.bad(node, "primitives", f"{path} used other than as a decorator: write @P.epilogue(...) on a def")
        elif kind == "from_quack":
            if id(node) not in self.allowed_calls:
                self.bad(node, "from_quack", f"{path} used as a value: P.from_quack takes only a literal target, "
                                             "called directly at module level")
        elif kind == "prepare_call" and not self.in_prepare:
            self.bad(node, "torch", f"{path} is allowed only inside prepare() and the helpers only it calls "
                                    "(weight preprocessing, not timed); a kernel computes only through primitives")
        elif kind in ("call", "prepare_call") and root in ("torch", "primitives") and not direct:
            self.bad(node, _rule_for(path), f"{path} used as a value: a {root} function may only be called directly")

    # ---- attributes ----------------------------------------------------------------

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.bad(node, "private", f"private attribute .{node.attr}")
            return
        if node.attr in INTROSPECTION_ATTRS:
            self.bad(node, "introspection", f".{node.attr} reaches interpreter internals (frames, code, generators)")
            if self._path(node.value) is None:
                self.visit(node.value)
            return
        path = self._path(node)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bad(node, "state", f"assigning or deleting attribute .{node.attr}")
            if path is None:
                self.visit(node.value)
            return
        if path is not None:
            self._judge_path(path, node)
            return  # the inner attributes are prefixes of the path just judged
        if self.epilogue is not None:
            self.bad(node, "method", f".{node.attr} of a value inside {self.epilogue_label}: the traced value is one "
                                     "float32 element (or a pair) and has no tensor methods; use arithmetic and P.* math")
        elif node.attr in VALUE_ATTRS:
            pass
        elif node.attr in INFO_ATTRS and isinstance(node.value, ast.Call) \
                and self._path(node.value.func) in ("torch.finfo", "torch.iinfo"):
            pass
        elif node.attr in PREPARE_METHODS and self.in_prepare:
            if id(node) not in self.callees:
                self.bad(node, "method", f".{node.attr} used as a value: in prepare() it may only be called directly")
        elif node.attr in PREPARE_METHODS:
            self.bad(node, "method", f".{node.attr} is allowed only inside prepare() and the helpers only it calls "
                                     "(weight preprocessing, not timed); compute goes through primitives")
        else:
            self.bad(node, "method", f".{node.attr} is not an allowed attribute (metadata, views and dict reads only; "
                                     "compute goes through primitives)")
        self.visit(node.value)

    # ---- calls ---------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        path = self._path(node.func)
        # out= is torch's "write into this tensor"; to the builtin dict, or to a def of the
        # kernel's own (checked on its own), it is a name like any other
        own = isinstance(node.func, ast.Name) and (
            (node.func.id == "dict" and self._is_builtin(node.func)) or self._single_def(node.func) is not None)
        for kw in node.keywords:
            if kw.arg == "out" and not own:
                self.bad(kw.value, "state", "a call with out= (it writes into an existing tensor)")
        is_torch = path is not None and path.split(".")[0] == "torch"
        is_method = isinstance(node.func, ast.Attribute) and path is None
        if (is_torch or is_method) and any(kw.arg is None for kw in node.keywords):
            self.bad(node, "state", "**kwargs into a torch function or a method (it could carry out=)")
        if path is not None and _kind(path) == "from_quack":
            self._check_from_quack(node)
        lazy = self._is_lazy_iterator(node)
        if lazy and id(node) not in self.consumed:
            self.bad(node, "state", f"{node.func.id}(...) kept as a value: a lazy iterator outlives the expression "
                                    "(state); iterate it, or pass it to list(...), tuple(...), dict(...) at once")
        if lazy or (isinstance(node.func, ast.Name) and node.func.id in CONSUMING_BUILTINS and self._is_builtin(node.func)):
            for a in node.args:
                self._consume(a)
        if self.epilogue is not None and not self._epilogue_callee_ok(node):
            for n in [*node.args, *node.keywords]:
                self.visit(n)
            return
        self.generic_visit(node)

    def _is_lazy_iterator(self, node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LAZY_BUILTINS
                and self._is_builtin(node.func))

    def _consume(self, node) -> None:
        """Mark an iterable that is used up where it stands (a for loop's or comprehension's
        iterable, an argument of a consuming builtin, a * argument, an unpacked value)."""
        if isinstance(node, ast.Starred):
            node = node.value
        if isinstance(node, ast.GeneratorExp) or self._is_lazy_iterator(node):
            self.consumed.add(id(node))

    def _is_builtin(self, name: ast.Name) -> bool:
        return name.id not in self.imports and self.scopes.of(name).resolve(name.id) is None

    def _check_from_quack(self, node: ast.Call) -> None:
        self.allowed_calls.add(id(node.func))
        target = node.args[0] if len(node.args) == 1 else None
        ok = (self.scopes.of(node).function() is self.scopes.module
              and isinstance(target, ast.Constant) and target.value in QUACK_EPILOGUES
              and all(kw.arg == "operands" for kw in node.keywords))
        if not ok:
            self.bad(node, "from_quack", 'P.from_quack takes only a literal "quack.epilogue.library:<name>" (or '
                                         '"quack.epilogue.rotary:<name>") naming one of quack 0.6.5\'s epilogues, '
                                         "and operands=, called at module level")

    def _epilogue_callee_ok(self, node: ast.Call) -> bool:
        """Inside an epilogue body a callee is the primitives' math (judged as a path) or an
        epilogue helper; False (reported here) for anything else."""
        f = node.func
        if any(kw.arg is None for kw in node.keywords):
            self.bad(node, "epilogue_body", f"**kwargs inside {self.epilogue_label}")
        if self._path(f) is not None or isinstance(f, ast.Attribute):
            return True  # visit_Attribute / _judge_path judge it
        if isinstance(f, ast.Name) and (self._single_def(f) in self.helpers or self._is_builtin(f)):
            return True  # a helper, or a builtin visit_Name names
        self.bad(node, "epilogue_body", f"a call of {ast.unparse(f)[:40]} inside {self.epilogue_label}: only the "
                                        "primitives' math and epilogue helpers may be called")
        return False

    # ---- functions -----------------------------------------------------------------

    def _is_constant_default(self, d) -> bool:
        if isinstance(d, (ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp)) and self._is_constant_expr(d, self.constants):
            return True
        if isinstance(d, ast.Tuple):
            return all(self._is_constant_default(e) for e in d.elts)
        path = self._path(d)
        return path is not None and _kind(path) == "data"

    def _check_defaults(self, node, what: str) -> None:
        for d in [*node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                if not self._is_constant_default(d):
                    self.bad(d, "state", f"default argument of {what} that is not a constant (a mutable default keeps state)")
                self.visit(d)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            self.allowed_calls.add(id(target))
            if not self._is_epilogue_decorator(dec):
                self.bad(dec, "state", f"decorator on {node.name}(): only @P.epilogue(...) is allowed")
            self.visit(dec)
        self._check_defaults(node, f"{node.name}()")
        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]:
            if a is not None:
                self._visit_annotation(a.annotation)
        self._visit_annotation(node.returns)
        if node in self.epilogue_defs:
            context = (node, f"epilogue {node.name}()", False)
        elif node in self.helpers:
            context = (node, self.helpers[node], False)
        else:
            context = (None, "", node in self.prepare_scope)
        outer = (self.epilogue, self.epilogue_label, self.in_prepare)
        self.epilogue, self.epilogue_label, self.in_prepare = context
        try:
            for stmt in node.body:
                self.visit(stmt)
        finally:
            self.epilogue, self.epilogue_label, self.in_prepare = outer

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._check_defaults(node, "a lambda")
        outer, self.in_prepare = self.in_prepare, False  # a lambda can outlive prepare(): ordinary rules
        try:
            self.visit(node.body)
        finally:
            self.in_prepare = outer

    def visit_AsyncFunctionDef(self, node) -> None:
        self.bad(node, "state", "async function")

    def visit_ClassDef(self, node) -> None:
        self.bad(node, "state", f"class definition {node.name!r} (operator overloading and metaclass tricks)")

    def visit_Global(self, node) -> None:
        self.bad(node, "state", "global statement")

    def visit_Nonlocal(self, node) -> None:
        self.bad(node, "state", "nonlocal statement")

    def visit_Yield(self, node) -> None:
        self.bad(node, "state", "generator (yield keeps state between calls)")

    visit_YieldFrom = visit_Yield

    def visit_Await(self, node) -> None:
        self.bad(node, "state", "await")

    def visit_AsyncFor(self, node) -> None:
        self.bad(node, "state", "async for/with")

    visit_AsyncWith = visit_AsyncFor

    def visit_Match(self, node) -> None:
        self.bad(node, "introspection", "match statement (class patterns read attributes by name)")

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        if id(node) not in self.consumed:
            self.bad(node, "state", "a generator expression kept as a value (an escaping generator is lazy state with "
                                    "a frame); iterate it, or pass it to sum/any/all/tuple/list/set/sorted/min/max/dict")
        self.generic_visit(node)

    # ---- operators -----------------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_prepare:
            self.bad(node, "matmul", "the @ operator (a matmul outside the fused GEMM; allowed only in prepare())")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if self.epilogue is not None and not isinstance(node.op, (ast.USub, ast.UAdd)):
            self.bad(node, "epilogue_body", f"`not`/`~` on a value inside {self.epilogue_label}")
            return
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if self.epilogue is not None and (len(node.ops) != 1 or not isinstance(node.ops[0], _EPILOGUE_COMPARISONS)):
            self.bad(node, "epilogue_body", f"a chained, identity or membership comparison inside {self.epilogue_label}")
            return
        self.generic_visit(node)

    # ---- epilogue control flow -------------------------------------------------------

    def visit_If(self, node: ast.If) -> None:
        if self.epilogue is None:
            self.generic_visit(node)
            return
        if not self._is_python_constant(node.test):
            self.bad(node, "epilogue_body", f"`if` on a value inside {self.epilogue_label}: the GPU traces the "
                                            "function once, so a condition may use only constants")
            self._visit_condition(node.test)
        for stmt in [*node.body, *node.orelse]:
            self.visit(stmt)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        if self.epilogue is None:
            self.generic_visit(node)
            return
        if not self._is_python_constant(node.test):
            self.bad(node, "epilogue_body", f"`x if c else y` on a value inside {self.epilogue_label}: a condition "
                                            "may use only constants")
            self._visit_condition(node.test)
        self.visit(node.body)
        self.visit(node.orelse)

    def _visit_condition(self, test) -> None:
        """Name what a rejected condition uses (a type test, torch ...), past its and/or/not."""
        if isinstance(test, ast.BoolOp):
            parts = test.values
        elif isinstance(test, ast.UnaryOp):
            parts = [test.operand]
        elif isinstance(test, ast.Compare):
            parts = [test.left, *test.comparators]
        else:
            self.visit(test)
            return
        for part in parts:
            self._visit_condition(part)

    def visit_For(self, node: ast.For) -> None:
        self._check_loop_target(node.target, "for")
        self._consume(node.iter)
        if self.epilogue is None:
            self.generic_visit(node)
            return
        it = node.iter
        if not (isinstance(node.target, ast.Name) and not node.orelse and isinstance(it, ast.Call)
                and isinstance(it.func, ast.Name) and it.func.id == "range" and self._is_builtin(it.func)
                and not it.keywords and 1 <= len(it.args) <= 3 and all(self._is_python_constant(a) for a in it.args)):
            self.bad(node, "epilogue_body", f"a for loop inside {self.epilogue_label}: only `for i in range(<constants>)`")
            return
        for stmt in node.body:
            self.visit(stmt)

    def visit_Starred(self, node: ast.Starred) -> None:
        if self.epilogue is not None and not isinstance(node.ctx, ast.Load):
            self.bad(node, "epilogue_body", f"starred unpacking inside {self.epilogue_label}")
            return
        if isinstance(node.ctx, ast.Load):
            self._consume(node.value)  # f(*it), [*it]
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if self.epilogue is not None and any(k is None for k in node.keys):
            self.bad(node, "epilogue_body", f"** in a dict inside {self.epilogue_label}")
        self.generic_visit(node)

    # ---- writes: what may be stored into -------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_store(t, node)
        if any(isinstance(t, (ast.Tuple, ast.List)) for t in node.targets):
            self._consume(node.value)  # unpacking uses it up: a, b = zip(*pairs)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_prepare:
            self.bad(node, "matmul", "the @= operator (allowed only in prepare())")
        self._check_store(node.target, node, augmented=True)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target, node)
        self._visit_annotation(node.annotation)
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_store(t, node)
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._check_loop_target(node.optional_vars, "with")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._check_loop_target(node.target, "comprehension")
        self._consume(node.iter)
        self.generic_visit(node)

    def _check_loop_target(self, target, what: str) -> None:
        """A for/with/comprehension target never writes through a subscript (attribute
        targets are reported as attribute stores)."""
        for t in ast.walk(target):
            if isinstance(t, ast.Subscript) and isinstance(t.ctx, ast.Store):
                self.bad(t, "state", f"a {what} target that writes into {ast.unparse(t.value)[:40]}[...] "
                                     "(bind a name, then write explicitly)")

    def _check_store(self, target, stmt, augmented: bool = False) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t, stmt)
            return
        if isinstance(target, ast.Starred):
            self._check_store(target.value, stmt)
            return
        scope = self.scopes.of(stmt).function()
        if scope is self.scopes.module:
            return  # module level runs once, at import: no state between calls
        if isinstance(target, ast.Name) and augmented:
            self._check_written_name(target.id, scope, stmt, f"augmented assignment to {target.id!r}")
        elif isinstance(target, ast.Subscript):
            if isinstance(target.value, ast.Name):
                self._check_written_name(target.value.id, scope, stmt, f"writing into {target.value.id!r}")
            else:
                self.bad(stmt, "state", f"writing into {ast.unparse(target.value)[:40]}[...]: only `name[...] = ...` "
                                        "on a fresh local of this function")

    def _check_written_name(self, name: str, scope: _Scope, stmt, what: str) -> None:
        if scope.resolve(name) is not scope:
            self.bad(stmt, "state", f"{what}, which this function does not own (module-level or closure: state between calls)")
        elif not self._fresh_local(name, scope, 0):
            func = scope.node
            if name == "prepared" and isinstance(func, ast.FunctionDef) and func.name == "run":
                self.bad(stmt, "state", "run() writes into prepared (it is read-only: state between calls)")
            else:
                self.bad(stmt, "state", f"{what}, which may alias an object that outlives the call: every binding of "
                                        "a local written into must be a fresh object ({}, [], a comprehension, dict(...), "
                                        "a torch allocation, a primitives call, arithmetic)")

    def _fresh_local(self, name: str, scope: _Scope, depth: int = 0) -> bool:
        """Every binding of a local gives it a fresh value (another fresh local of the same
        function counts: an alias of a new object is no older object). Memoized; a cycle
        of aliases, or a chain longer than 32, counts as not fresh."""
        key = (id(scope), name)
        if depth > 32:
            return False
        if key not in self.fresh:
            self.fresh[key] = False  # while it is being decided: a cycle is not fresh
            values = []
            for b in scope.bindings.get(name, []):
                if b.kind == "value":
                    values.append(b.node)
                elif b.kind not in ("augmented", "annotation", "del"):
                    return False  # a parameter, a loop/with/except/walrus target, an import, a def
            self.fresh[key] = bool(values) and all(self._is_fresh(v, scope, depth + 1) for v in values)
        return self.fresh[key]

    def _is_fresh(self, node, scope: _Scope, depth: int = 0) -> bool:
        """The expression's value is a new object or an immutable one."""
        if isinstance(node, (ast.Dict, ast.List, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.Tuple,
                             ast.Constant, ast.JoinedStr, ast.BinOp, ast.UnaryOp, ast.Compare)):
            return True
        if isinstance(node, ast.BoolOp):
            return all(self._is_fresh(v, scope, depth) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self._is_fresh(node.body, scope, depth) and self._is_fresh(node.orelse, scope, depth)
        if isinstance(node, ast.Name):
            return (node.id not in self.imports and self.scopes.of(node).resolve(node.id) is scope
                    and self._fresh_local(node.id, scope, depth))
        if self._is_immutable_metadata(node):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            path = self._path(f)
            if path is not None:
                kind, last = _kind(path), path.split(".")[-1]
                if path.startswith("torch."):
                    return kind == "call" or (kind == "prepare_call" and last not in TORCH_PREPARE_VIEWS)
                return path.startswith("primitives.") and kind in ("call", "data")
            if isinstance(f, ast.Name):
                if self._is_builtin(f):
                    return f.id in FRESH_BUILTINS
                return self._is_epilogue_object(f)
            if isinstance(f, ast.Attribute):
                return f.attr in FRESH_METHODS
        return False

    def _is_immutable_metadata(self, node) -> bool:
        """x.shape, x.shape[0], x.size(1), x.dtype ...: values that cannot be written into."""
        if isinstance(node, ast.Attribute):
            return node.attr in IMMUTABLE_ATTRS and self._path(node) is None
        if isinstance(node, ast.Subscript):
            return self._is_immutable_metadata(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and self._path(node.func) is None:
            return node.func.attr in IMMUTABLE_METHODS
        return False

    def _is_epilogue_object(self, name: ast.Name) -> bool:
        """A name bound once to an @P.epilogue def or to P.from_quack(...): calling it
        returns a new dict."""
        owner = self.scopes.of(name).resolve(name.id)
        bindings = owner.bindings[name.id] if owner is not None else []
        if len(bindings) != 1:
            return False
        b = bindings[0]
        if b.kind == "def":
            return b.node in self.epilogue_defs
        return (b.kind == "value" and isinstance(b.node, ast.Call)
                and self._path(b.node.func) is not None and _kind(self._path(b.node.func)) == "from_quack")


def syntax_error_line(e: SyntaxError) -> str:
    """A SyntaxError in one line: "line N: syntax error: why", without the line where Python
    names none (a NUL byte in the source)."""
    return (f"line {e.lineno}: " if e.lineno else "") + f"syntax error: {e.msg}"
