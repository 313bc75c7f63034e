"""An epilogue as data: its function traced once on symbolic values into a graph of the
operations it applies, and the graph run again as an epilogue function.

Why: a verdict's launch evidence is only as good as the process that gathers it. A process
that runs no kernel code can build the kernel that a kernel's process describes, if the
description is data: `trace(epi)` records, in order, every operator (+ - * / // % ** unary
- +, the six comparisons) and every primitive call (P.exp ... P.where, pack, unpack) that
the function applies to its inputs, and `rebuild(graph, epi)` gives an Epilogue whose
function replays exactly those operations, in the same order and with the same operand
order, on whatever values it gets: torch tensors in the emulator, CuTe-DSL values while
quack traces the kernel. Replaying the same Python-level operations makes the same values
(tests/test_epilogue_graph.py checks every expert kernel's epilogues bit for bit).

The function is run once, on `Sym` values; it can only record operations: a Sym has no
attributes, refuses to be a condition (`if acc > 0`, `and`, `or`), and refuses iteration.
Python numbers in it become constants of the graph. A graph is plain tuples of strings,
numbers and booleans (quack fingerprints a function's closure by value, so two graphs never
share a compiled kernel), with a JSON form for crossing a process boundary.
"""

from __future__ import annotations

import functools
import inspect
import json
import operator
from contextlib import contextmanager
from dataclasses import dataclass

#: binary operators by graph name; a reflected one (2.0 * x) is recorded in source order
BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
          "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
          "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
          "gt": operator.gt, "ge": operator.ge}
UNARY = {"neg": operator.neg, "pos": operator.pos}
#: the primitive calls a graph may hold, with how many values each returns (1: one value)
CALLS = {"sigmoid": 1, "silu": 1, "swiglu": 1, "dswiglu": 3, "exp": 1, "log": 1, "rsqrt": 1, "fma": 1,
         "rope_rotate": 2, "max": 1, "min": 1, "abs": 1, "relu": 1, "squared_relu": 1, "tanh": 1, "erf": 1,
         "erfc": 1, "gelu": 1, "gelu_tanh": 1, "where": 1, "pack": 1, "unpack": 2}
#: bounds on what one trace may record (an epilogue body is short; a loop over range()
#: constants unrolls, so a bound keeps a hostile one from filling memory)
MAX_NODES = 20_000


class GraphError(ValueError):
    """An epilogue that cannot be traced into a graph, or a graph that is not well formed
    (one clear line)."""


class Sym:
    """A value while an epilogue function is traced: every operation on it is recorded."""

    __slots__ = ("_graph", "_index")

    def __init__(self, graph: "_Recorder", index: int):
        self._graph, self._index = graph, index

    def __bool__(self):
        raise GraphError("a condition on a value (`if`, `and`, `or`, `not`, a chained comparison): "
                         "use P.where(cond, a, b)")

    def __iter__(self):
        raise GraphError("a value cannot be iterated: use P.unpack(pair)")

    def __getattr__(self, name):
        raise GraphError(f"a value has no attribute .{name} (an epilogue body sees one element)")

    __hash__ = object.__hash__


def _binary(name):
    def forward(self, other):
        return self._graph.op(name, self, other)

    def reflected(self, other):
        return self._graph.op(name, other, self)
    return forward, reflected


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"):
    _f, _r = _binary(_name)
    setattr(Sym, f"__{_name}__", _f)
    setattr(Sym, f"__r{_name}__", _r)
# comparisons have no reflected forms: `0 < x` reaches x.__gt__(0), recorded as written there
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Sym, f"__{_name}__", _binary(_name)[0])
Sym.__neg__ = lambda self: self._graph.op("neg", self)
Sym.__pos__ = lambda self: self._graph.op("pos", self)


def is_symbolic(*values) -> bool:
    """True when any value (or an element of a tuple argument) is a Sym: a trace runs."""
    for v in values:
        if isinstance(v, Sym) or (isinstance(v, tuple) and any(isinstance(x, Sym) for x in v)):
            return True
    return False


def traced(fn):
    """Make a primitive recordable: called with a Sym among its arguments, it records itself
    (by its name, which must be in CALLS) instead of computing."""
    name = fn.__name__
    assert name in CALLS, name

    @functools.wraps(fn)
    def primitive(*args):
        if is_symbolic(*args):
            return _recorder_of(args).call(name, args)
        return fn(*args)
    return primitive


def _recorder_of(args) -> "_Recorder":
    for v in args:
        for x in (v if isinstance(v, tuple) else (v,)):
            if isinstance(x, Sym):
                return x._graph
    raise AssertionError("no Sym among the arguments")


class _Recorder:
    """The nodes of one trace, appended as the function applies operations."""

    def __init__(self):
        self.nodes: list[tuple] = []

    def add(self, node: tuple) -> Sym:
        if len(self.nodes) >= MAX_NODES:
            raise GraphError(f"the epilogue applies more than {MAX_NODES} operations")
        self.nodes.append(node)
        return Sym(self, len(self.nodes) - 1)

    def arg(self, value):
        if isinstance(value, Sym):
            if value._graph is not self:
                raise GraphError("a value from another trace")
            return ("v", value._index)
        if isinstance(value, tuple):
            return ("t", tuple(self.arg(x) for x in value))
        if type(value) in (int, float, bool):
            return ("k", value)
        raise GraphError(f"an epilogue value may be a number, not {type(value).__name__}")

    def op(self, name: str, *args) -> Sym:
        return self.add((name, *(self.arg(a) for a in args)))

    def call(self, name: str, args) -> Sym | tuple:
        out = self.add(("call", name, *(self.arg(a) for a in args)))
        n = CALLS[name]
        if n == 1:
            return out
        return tuple(self.add(("item", ("v", out._index), ("k", i))) for i in range(n))


@dataclass(frozen=True)
class Graph:
    """A traced epilogue function: its parameter names (acc first), its nodes in the order
    they were applied, and each returned name's value.

    nodes: (op, *args) with op an input ("input", ("k", name)), a BINARY or UNARY name, a
    primitive call ("call", name, *args) (name a key of CALLS) or the i-th value of a call that returns several
    ("item", ("v", j), ("k", i)). An argument is ("v", j) (node j's value), ("k", number)
    or ("t", (args...)) (a tuple). returns: ((name, arg), ...) in the order returned."""

    params: tuple[str, ...]
    nodes: tuple[tuple, ...]
    returns: tuple[tuple[str, tuple], ...]

    def to_json(self) -> str:
        return json.dumps({"params": self.params, "nodes": [_encode(n) for n in self.nodes],
                           "returns": [[name, _encode(a)] for name, a in self.returns]})

    @classmethod
    def from_json(cls, text: str) -> "Graph":
        """Parse and check a graph (an untrusted process may have written it)."""
        try:
            data = json.loads(text)
            graph = cls(params=tuple(str(p) for p in data["params"]),
                        nodes=tuple(_decode(n) for n in data["nodes"]),
                        returns=tuple((str(name), _decode(a)) for name, a in data["returns"]))
            graph.check()
        except GraphError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as e:  # a node of the wrong shape too
            raise GraphError(f"not an epilogue graph: {type(e).__name__}: {str(e)[:200]}") from None
        return graph

    def check(self) -> None:
        """Every node well formed and referring only to earlier nodes; bounded in size."""
        if len(self.nodes) > MAX_NODES:
            raise GraphError(f"more than {MAX_NODES} nodes")
        if not self.params or self.params[0] != "acc" or len(set(self.params)) != len(self.params) \
                or not all(p.isidentifier() for p in self.params):
            raise GraphError(f"bad parameter names {self.params!r}")

        def arg(a, before: int, depth: int = 0):
            if not (isinstance(a, tuple) and len(a) == 2) or depth > 4:
                raise GraphError(f"bad argument {a!r}")
            tag, v = a
            if tag == "v":
                if not (type(v) is int and 0 <= v < before):
                    raise GraphError(f"argument {a!r} is not an earlier node")
            elif tag == "k":
                if type(v) not in (int, float, bool):
                    raise GraphError(f"bad constant {v!r}")
            elif tag == "t":
                if not isinstance(v, tuple):
                    raise GraphError(f"bad tuple {a!r}")
                for x in v:
                    arg(x, before, depth + 1)
            else:
                raise GraphError(f"bad argument {a!r}")

        inputs = []
        for i, node in enumerate(self.nodes):
            if not (isinstance(node, tuple) and node and isinstance(node[0], str)):
                raise GraphError(f"node {i} is not (op, *args)")
            op, args = node[0], node[1:]
            if op == "input":
                if len(args) != 1 or args[0] not in [("k", p) for p in self.params]:
                    raise GraphError(f"node {i}: an input must name a parameter")
                inputs.append(args[0][1])
                continue
            if op in BINARY and len(args) == 2 or op in UNARY and len(args) == 1:
                pass
            elif op == "call":
                if not args or not (isinstance(args[0], str) and args[0] in CALLS):
                    raise GraphError(f"node {i}: unknown call {args[:1]!r}")
                args = args[1:]
            elif op == "item":
                if len(args) != 2 or args[1][0] != "k" or type(args[1][1]) is not int:
                    raise GraphError(f"node {i}: bad item")
                j = args[0][1] if args[0][0] == "v" else -1
                if not (0 <= j < i and self.nodes[j][0] == "call" and 0 <= args[1][1] < CALLS[self.nodes[j][1]]):
                    raise GraphError(f"node {i}: an item must take a value of an earlier multi-valued call")
                continue
            else:
                raise GraphError(f"node {i}: unknown op {op!r}")
            for a in args:
                arg(a, i)
        if sorted(inputs) != sorted(self.params):
            raise GraphError("every parameter is one input node")
        names = [name for name, _ in self.returns]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise GraphError(f"bad returned names {names!r}")
        for _, a in self.returns:
            arg(a, len(self.nodes))


def _encode(x):
    """JSON form: tuples as lists, floats exactly (hex, so NaN, inf and -0.0 survive)."""
    if isinstance(x, tuple):
        return [_encode(v) for v in x]
    if type(x) is float:
        return {"f": x.hex()}
    return x


def _decode(x):
    if isinstance(x, list):
        return tuple(_decode(v) for v in x)
    if isinstance(x, dict):
        if set(x) != {"f"} or not isinstance(x["f"], str):
            raise ValueError(f"bad constant {x!r}")
        return float.fromhex(x["f"])
    if x is None or type(x) not in (str, int, bool):
        raise ValueError(f"bad value {x!r}")
    return x


def trace(epi) -> Graph:
    """Run `epi`'s function once on symbolic values and return what it applied. Raises
    GraphError for a function that does anything but compute with its values (or that
    fails, raises, or returns something other than a dict of values)."""
    if epi.from_library:
        raise GraphError(f"{epi.name}: a quack library epilogue is rebuilt from its name, not traced")
    rec = _Recorder()
    params = ("acc", *epi.params)
    syms = {p: rec.add(("input", ("k", p))) for p in params}
    try:
        out = epi.fn(**syms)
    except GraphError:
        raise
    except RecursionError:
        raise GraphError(f"{epi.name}: the function recursed too deeply") from None
    except Exception as e:  # noqa: BLE001 - whatever the function raises is its failure to trace
        raise GraphError(f"{epi.name}: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(out, dict) or not all(type(k) is str for k in out):
        raise GraphError(f"{epi.name}: the function must return a dict of values")
    graph = Graph(params=params, nodes=tuple(rec.nodes), returns=tuple((k, rec.arg(v)) for k, v in out.items()))
    graph.check()
    return graph


def run(graph: Graph, values: dict) -> dict:
    """Replay the graph on real values (torch tensors, CuTe-DSL values, pairs of either)."""
    from epiforge.primitives import math as pmath
    from epiforge.primitives import values as pvalues

    done: list = []

    def value(a):
        tag, v = a
        if tag == "v":
            return done[v]
        if tag == "k":
            return v
        return tuple(value(x) for x in v)

    for node in graph.nodes:
        op = node[0]
        if op == "input":
            done.append(values[node[1][1]])
        elif op == "call":
            name = node[1]
            fn = getattr(pvalues if name in ("pack", "unpack") else pmath, name)
            done.append(fn(*(value(a) for a in node[2:])))
        elif op == "item":
            done.append(value(node[1])[node[2][1]])
        elif op in UNARY:
            done.append(UNARY[op](value(node[1])))
        else:
            done.append(BINARY[op](value(node[1]), value(node[2])))
    return {name: value(a) for name, a in graph.returns}


def as_function(graph: Graph):
    """The graph as an epilogue function with the traced function's parameters (quack reads
    the signature; it fingerprints this function's closure, the graph, by value)."""
    params = graph.params

    def replayed(*args, **kwargs):
        bound = dict(zip(params, args))
        bound.update(kwargs)
        return run(graph, bound)

    replayed.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    replayed.__name__ = replayed.__qualname__ = "replayed"
    return replayed


def rebuild(graph: Graph, declared):
    """An Epilogue running `graph`, with `declared`'s declarations (outputs, operands,
    reductions, mode, pair outputs) and name."""
    from epiforge.primitives.epilogue import Epilogue

    if graph.params != ("acc", *declared.params):
        raise GraphError(f"the graph's parameters {graph.params[1:]} are not {declared.params}")
    fn = as_function(graph)
    fn.__name__ = fn.__qualname__ = declared.name
    return Epilogue(fn=fn, outputs=declared.outputs, operands=dict(declared.operands),
                    reductions=dict(declared.reductions), mode=declared.mode, author=declared.author,
                    pair_outputs=declared.pair_outputs, graph=graph)


_replaying = False


def replay_active() -> bool:
    return _replaying


@contextmanager
def replaying():
    """Inside: every @epilogue call runs its function's traced graph (rebuilt once per
    epilogue, through the graph's JSON form) instead of the function itself; quack library
    epilogues run as they are. The seam for checking that a graph computes what its
    function does (tests/test_epilogue_graph.py)."""
    global _replaying
    outer, _replaying = _replaying, True
    try:
        yield
    finally:
        _replaying = outer

