"""Static (AST) rules for a candidate kernel, checked before anything of it runs.

The contract: a kernel computes only through `primitives` (the fused GEMM with its epilogue,
the task's named finishing steps, the prepare helpers). Its own code wires inputs to one
primitive call and names the outputs. The rules are an allowlist: whatever is not listed
below is rejected (STATIC_REJECTED), so a disguise nobody thought of fails closed.

What a kernel may use
---------------------
imports      `import primitives [as P]`, `from primitives import <public name>`,
             `from primitives.config import GemmConfig | DEFAULT_CONFIG | pick_config`,
             `import torch [as t]`, `from torch import <allowed torch name>`, `import math`,
             `from math import ...`, `import typing` / `from typing import ...`,
             `from __future__ import annotations`.
primitives   P.<name> for every name in primitives.__all__ except `Epilogue` (building one by
             hand can give the CPU emulator a different function than the GPU compiles);
             P.finish.<finishing step> (primitives.finish.FINISHERS); P.prepare.<helper>;
             P.from_quack only with a literal "quack.epilogue.<module>:<name>" string (it
             imports what the string names).
torch        dtype and type names (torch.bfloat16 ... torch.dtype, torch.Tensor, torch.Size,
             torch.device, torch.finfo, torch.iinfo) and allocation (torch.empty, empty_like,
             empty_strided, zeros, zeros_like, ones, ones_like, full, full_like). A filled
             allocation inside run() is a kernel launch: the launch check counts it.
math         any public name (it works on Python numbers, e.g. `1.0 / math.sqrt(d)`).
on values    metadata: shape dtype device ndim T mT is_cuda layout itemsize nbytes size dim
             stride numel is_contiguous is_floating_point element_size storage_offset;
             views: view view_as reshape t transpose permute unsqueeze squeeze expand
             expand_as narrow select split chunk unbind flatten unflatten movedim swapaxes
             contiguous; allocation: new_empty new_zeros new_ones new_full; dict reads: get
             items keys values; GemmConfig fields: tile_m tile_n cluster_m cluster_n
             pingpong max_swizzle_size key.
builtins     abs all any bool callable dict divmod enumerate filter float format frozenset
             int isinstance len list map max min pow print range repr reversed round set
             slice sorted str sum tuple zip, and the common exception classes.
operators    every Python operator except `@` (on tensors it is a matmul); inside an
             epilogue function they are the epilogue's math, elsewhere the launch check (GPU)
             or the compute guard (CPU) catches tensor arithmetic.

What is rejected (rule names as they appear in messages)
--------------------------------------------------------
import       any other import: os, sys, ctypes, gc, inspect, importlib, time, threading,
             subprocess, socket, torch.<submodule>, tasks, eval, quack, triton, cutlass ...
name         a name that is neither defined in the file nor an allowed builtin (open, exec,
             eval, compile, getattr, setattr, globals, vars, __import__, __builtins__ ...);
             binding a name that shadows a builtin; any __dunder__ name.
private      any attribute that starts with "_" (x.__class__, torch._C, P._anything).
torch        torch.<anything else>: matmul, mm, einsum, nn, cuda (streams, events), ops,
             compile, load, manual_seed, ...; a module used as a plain value (`T = torch`).
primitives   a primitives name outside the public API (P.emulator, P.Epilogue, ...).
method       an attribute of a value outside the list above (x.matmul, x.mm, x.sum, x.float,
             x.to, x.cpu, x.copy_, x.item, x.data_ptr, d.update, d.setdefault, ...).
matmul       the `@` operator.
state        anything that keeps state between calls: global/nonlocal, assigning an
             attribute, writing into a name the function does not own (module-level or
             closure), writing into run()'s `prepared`, defaults that are not constants,
             decorators other than P.epilogue(...), class definitions, generators, async.
from_quack   P.from_quack with anything but a literal "quack.epilogue.<module>:<name>".
epilogue     torch.<anything> inside an @P.epilogue function: it cannot compile for sm_90a,
             so it is reported as a COMPILE_ERROR. Methods on values inside an epilogue
             function are left to the DSL compiler (the sm_90a compile and the GPU judge them).

The rules read only the source: a kernel cannot change them by what it does at run time.
Behind them, the worker checks what the rules cannot see (eval/guard.py, eval/numerics.py).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

ALLOWED_PRIMITIVES = frozenset({
    "ColReduce", "DEFAULT_CONFIG", "EpilogueError", "GemmConfig", "PerCol", "PerRow", "RowLogSumExp",
    "RowReduce", "RowSelect", "Scalar", "Tile", "dswiglu", "epilogue", "exp", "finish", "fma", "from_quack",
    "log", "pack", "partials_shape", "pick_config", "prepare", "rope_rotate", "rsqrt", "sigmoid", "silu",
    "swiglu", "unpack", "config",
})
PRIMITIVE_SUBMODULES = {
    "finish": frozenset({"rstd_from_sumsq", "row_sum", "col_sum", "cross_entropy"}),
    "prepare": frozenset({"rope_freq_table", "qkv_rope_freq_table"}),
    "config": frozenset({"GemmConfig", "DEFAULT_CONFIG", "pick_config"}),
}
TORCH_DTYPES = frozenset({
    "bfloat16", "float16", "half", "float32", "float", "float64", "double", "int8", "uint8", "int16",
    "int32", "int", "int64", "long", "bool", "float8_e4m3fn", "float8_e5m2",
})
TORCH_TYPES = frozenset({"dtype", "Tensor", "Size", "device", "finfo", "iinfo"})
TORCH_ALLOC = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
})
ALLOWED_TORCH = TORCH_DTYPES | TORCH_TYPES | TORCH_ALLOC
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
ALLOWED_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "dict", "divmod", "enumerate", "filter", "float", "format",
    "frozenset", "int", "isinstance", "len", "list", "map", "max", "min", "pow", "print", "range", "repr",
    "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip",
    "Exception", "ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "AssertionError",
    "NotImplementedError", "ArithmeticError", "ZeroDivisionError",
})
ALLOWED_MODULES = {"primitives", "primitives.config", "torch", "math", "typing", "__future__"}
_FROM_QUACK_TARGET = re.compile(r"quack\.epilogue\.[a-z_][a-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} [{self.rule}]"


def check_source(source: str, filename: str = "<kernel>") -> list[Violation]:
    """Every rule violation in a kernel's source (empty: it may run). A syntax error is
    raised as SyntaxError (the caller reports it as a compile error)."""
    tree = ast.parse(source, filename=filename)
    return _Checker(tree).run()


def check_file(path) -> list[Violation]:
    from pathlib import Path

    p = Path(path)
    return check_source(p.read_text(), str(p))


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.out: list[Violation] = []
        self.modules: dict[str, str] = {}  # local alias -> dotted module path (torch, primitives.finish ...)
        self.objects: dict[str, str] = {}  # local alias -> dotted path of an imported object
        self.scopes: list[tuple[str, set[str]]] = []  # (function name, its own names), innermost last
        self.module_level: set[str] = set()
        self.in_epilogue: str | None = None  # the @P.epilogue function being visited

    def bad(self, node, rule: str, message: str) -> None:
        self.out.append(Violation(rule, getattr(node, "lineno", 0), message))

    def run(self) -> list[Violation]:
        self._collect_bindings()
        self.visit(self.tree)
        return sorted(set(self.out), key=lambda v: (v.line, v.rule, v.message))

    # ---- names -------------------------------------------------------------------------

    def _collect_bindings(self) -> None:
        for node in ast.walk(self.tree):
            for n, where in _bound_here(node):
                if n in _BUILTIN_NAMES and n not in ALLOWED_BUILTINS:
                    self.bad(where, "name", f"binding {n!r} shadows the builtin of that name")
                if n.startswith("__") and n.endswith("__"):
                    self.bad(where, "name", f"dunder name {n!r}")
        self.module_level = _own_names(self.tree.body)

    def _visible(self, name: str) -> bool:
        return name in self.module_level or any(name in own for _, own in self.scopes)

    def visit_Name(self, node: ast.Name) -> None:
        n = node.id
        if n.startswith("__") and n.endswith("__") and not (n == "__name__" and isinstance(node.ctx, ast.Load)):
            self.bad(node, "name", f"dunder name {n!r}")
        elif isinstance(node.ctx, ast.Load) and n in self.modules:
            self.bad(node, "torch" if self.modules[n] == "torch" else "primitives",
                     f"module {n!r} used as a value; only {n}.<allowed name> may be used")
        elif isinstance(node.ctx, ast.Load) and not self._visible(n) and n not in ALLOWED_BUILTINS and n != "__name__":
            what = "a builtin outside the allowlist" if n in _BUILTIN_NAMES else "not defined in the kernel"
            self.bad(node, "name", f"{n!r} is {what}")

    # ---- imports -----------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name not in ALLOWED_MODULES or a.name == "primitives.config":
                self.bad(node, "import", f"import {a.name} is not allowed (allowed: primitives, torch, math, typing)")
                continue
            if "." in a.name and not a.asname:
                self.bad(node, "import", f"import {a.name} without 'as'")
            self.modules[a.asname or a.name] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or mod not in ALLOWED_MODULES:
            self.bad(node, "import", f"from {'.' * node.level}{mod} import ... is not allowed")
            return
        for a in node.names:
            if a.name == "*":
                self.bad(node, "import", f"from {mod} import * is not allowed")
                continue
            local = a.asname or a.name
            path = f"{mod}.{a.name}"
            if mod in ("math", "typing", "__future__"):
                if a.name.startswith("_") and mod != "__future__":
                    self.bad(node, "private", f"from {mod} import {a.name}")
                self.objects[local] = path
            elif not self._allowed_path(path):
                self.bad(node, "import" if mod == "torch" else "primitives", f"from {mod} import {a.name} is not allowed")
            elif path in ("primitives.finish", "primitives.prepare", "primitives.config"):
                self.modules[local] = path
            else:
                self.objects[local] = path

    def _allowed_path(self, path: str) -> bool:
        parts = path.split(".")
        if parts[0] == "torch":
            return len(parts) == 2 and parts[1] in ALLOWED_TORCH
        if parts[0] == "math":
            return len(parts) == 2 and not parts[1].startswith("_")
        if parts[0] == "typing":
            return len(parts) == 2 and not parts[1].startswith("_")
        if parts[0] == "primitives":
            if len(parts) == 2:
                return parts[1] in ALLOWED_PRIMITIVES
            if len(parts) == 3:
                return parts[1] in PRIMITIVE_SUBMODULES and parts[2] in PRIMITIVE_SUBMODULES[parts[1]]
        return False

    # ---- attributes --------------------------------------------------------------------

    def _module_path(self, node) -> str | None:
        """torch.x.y -> 'torch.x.y' when the chain starts at an imported module alias."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.modules:
            return ".".join([self.modules[node.id], *reversed(parts)])
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            self.bad(node, "private", f"private attribute .{node.attr}")
            return
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bad(node, "state", f"assigning or deleting attribute .{node.attr}")
        path = self._module_path(node)
        if path is not None and self.in_epilogue and path.startswith("torch.") and not self._allowed_path(path):
            self.bad(node, "epilogue", f"{path} inside epilogue {self.in_epilogue}(): the function is traced for "
                                       "sm_90a, where only arithmetic and the primitives' math compile (P.sigmoid, P.exp ...)")
            return
        if path is not None:
            # judge the whole chain once, at its outermost attribute
            if not self._allowed_path(path):
                root = path.split(".")[0]
                rule = "torch" if root == "torch" else "primitives" if root == "primitives" else "import"
                why = {"torch": "a kernel computes only through primitives",
                       "primitives": "not part of the primitives' public API"}.get(rule, "")
                self.bad(node, rule, f"{path} is not allowed" + (f": {why}" if why else ""))
            return  # do not descend: the inner attributes are prefixes of an allowed path
        if node.attr not in VALUE_ATTRS and not self.in_epilogue:
            # inside an epilogue body a method is the DSL compiler's to judge (sm_90a compile,
            # GPU); the emulator may run more than compiles, so a CPU pass without the
            # compile check is provisional there
            self.bad(node, "method", f".{node.attr} is not an allowed attribute (metadata, views and dict reads only; compute goes through primitives)")
        self.visit(node.value)

    # ---- operators ---------------------------------------------------------------------

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.bad(node, "matmul", "the @ operator (a matmul outside the fused GEMM)")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult):
            self.bad(node, "matmul", "the @= operator")
        self._check_store_target(node.target, node)
        self.generic_visit(node)

    # ---- state -------------------------------------------------------------------------

    def _root_name(self, node) -> str | None:
        while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def _check_store_target(self, target, node) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store_target(t, node)
            return
        if not isinstance(target, ast.Subscript) or not self.scopes:
            return  # module level runs once, at import: no state between calls
        root = self._root_name(target)
        func, own = self.scopes[-1]
        if root is None:
            self.bad(node, "state", "writing into the result of an expression")
        elif func == "run" and root == "prepared":
            self.bad(node, "state", "run() writes into prepared (it is read-only: state between calls)")
        elif root not in own:
            self.bad(node, "state", f"writing into {root!r}, which this function does not own (state between calls)")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_store_target(t, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store_target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_store_target(t, node)
        self.generic_visit(node)

    def visit_Global(self, node) -> None:
        self.bad(node, "state", "global statement")

    def visit_Nonlocal(self, node) -> None:
        self.bad(node, "state", "nonlocal statement")

    def visit_ClassDef(self, node) -> None:
        self.bad(node, "state", f"class definition {node.name!r} (operator overloading and metaclass tricks)")

    def visit_AsyncFunctionDef(self, node) -> None:
        self.bad(node, "state", "async function")

    def visit_Yield(self, node) -> None:
        self.bad(node, "state", "generator (yield keeps state between calls)")

    visit_YieldFrom = visit_Yield

    def visit_Await(self, node) -> None:
        self.bad(node, "state", "await")

    def _function_names(self, node) -> set[str]:
        own = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
        own |= {a.arg for a in (node.args.vararg, node.args.kwarg) if a}
        return own | _own_names(node.body if isinstance(node.body, list) else [node.body])

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for d in [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]:
            if not (isinstance(d, ast.Constant) or self._module_path(d) is not None):
                self.bad(d, "state", f"default argument of {node.name}() that is not a constant (a mutable default keeps state)")
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            path = self._module_path(target) or self.objects.get(getattr(target, "id", ""), "")
            if path != "primitives.epilogue" or not isinstance(dec, ast.Call):
                self.bad(dec, "state", f"decorator on {node.name}(): only @P.epilogue(...) is allowed")
        for dec in node.decorator_list:
            self.visit(dec)
        for d in [*node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        all_args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg]
        for ann in [a.annotation for a in all_args if a is not None] + [node.returns]:
            if ann is not None:
                self.visit(ann)
        is_epilogue = any(isinstance(d, ast.Call) and (self._module_path(d.func) or self.objects.get(getattr(d.func, "id", ""), ""))
                          == "primitives.epilogue" for d in node.decorator_list)
        outer = self.in_epilogue
        self.in_epilogue = node.name if is_epilogue else outer
        self.scopes.append((node.name, self._function_names(node)))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()
        self.in_epilogue = outer

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for d in [*node.args.defaults, *node.args.kw_defaults]:
            if d is not None and not isinstance(d, ast.Constant):
                self.bad(d, "state", "lambda default that is not a constant")
        self.scopes.append(("<lambda>", self._function_names(node)))
        self.visit(node.body)
        self.scopes.pop()

    # ---- calls -------------------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        path = self._module_path(node.func) or self.objects.get(getattr(node.func, "id", ""), "")
        if path == "primitives.from_quack":
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _FROM_QUACK_TARGET.fullmatch(arg.value)):
                self.bad(node, "from_quack", 'P.from_quack takes only a literal "quack.epilogue.<module>:<name>"')
        self.generic_visit(node)


def _bound_here(node) -> list[tuple[str, ast.AST]]:
    """The names a node binds (in whatever scope)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [(node.id, node)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, node)]
    if isinstance(node, ast.arg):
        return [(node.arg, node)]
    if isinstance(node, ast.alias):
        return [((node.asname or node.name).split(".")[0], node)]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [(node.name, node)]
    return []


def _own_names(body: list) -> set[str]:
    """Names bound by these statements in their own scope (not inside nested functions)."""
    own: set[str] = set()
    stack = list(body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(n.name)
            stack.extend(n.decorator_list)
            if not isinstance(n, ast.ClassDef):
                stack.extend(d for d in [*n.args.defaults, *n.args.kw_defaults] if d is not None)
            continue  # its body is its own scope
        if isinstance(n, ast.Lambda):
            continue
        if not isinstance(n, ast.arg):
            own.update(name for name, _ in _bound_here(n))
        stack.extend(ast.iter_child_nodes(n))
    return own


def only_compile_errors(violations: list[Violation]) -> bool:
    """True when every violation is torch code inside an epilogue body: it cannot compile
    for the GPU, which is what the kernel's author needs to hear (COMPILE_ERROR)."""
    return bool(violations) and all(v.rule == "epilogue" for v in violations)


def summarize(violations: list[Violation], limit: int = 3) -> str:
    """One line for a Result message."""
    head = "; ".join(str(v) for v in violations[:limit])
    more = f" (+{len(violations) - limit} more)" if len(violations) > limit else ""
    return f"static checks: {head}{more}"
