"""A kernel's calls as data: what its prepare() and run() do, described on shapes alone, and
run again from the description by code that is not the kernel's.

Why: the judge can trust what it saw launched only if a process that runs no kernel code
launched it. `describe(module, specs, consts, device)` runs the kernel's prepare() and run() on
fake tensors (shapes, strides, dtypes and the judge's device, no values) and records, in order, each primitive call (a fused
GEMM with its epilogue as a graph, primitives/graph.py, or as a quack library name; a
finishing step; a prepare helper) and each torch operation the kernel's own code applied
between them (by its aten name: views and allocations for an honest kernel, anything else is
compute the launch check counts). `execute(program, values)` replays the description on
real tensors with the primitives' own code: epilogues rebuilt from their graphs, library
epilogues from their names, aten operations through torch. The kernel's process never
holds a value, so nothing it does can depend on one, and what runs is only what it
described.

A program is plain JSON (`Program.to_json` / `Program.from_json`, which checks it): values
are numbered; value i is the i-th input (in `inputs` order), then each step's outputs in
turn. An argument is a number, string, bool or null, or a tagged object: {"v": i} a value,
{"list": [...]}, {"dict": {...}}, {"dtype": name}, {"config": key}, {"float": hex} (NaN and
infinities), {"memory_format": name}, {"layout": "strided"}, {"device": null} (the device
the program runs on).
"""

from __future__ import annotations

import functools
import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from epiforge.primitives import graph as _graph

#: the step kinds: a torch operation of the kernel's own code, or a primitive call
KINDS = ("aten", "gemm", "finish", "prepare")
#: how many steps one description may hold (a kernel calls a few dozen)
MAX_STEPS = 10_000
_ATEN = re.compile(r"aten::[a-z_][a-z0-9_]*(\.[a-zA-Z0-9_]+)?$")
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool)}
_FORMATS = {"contiguous_format": torch.contiguous_format, "preserve_format": torch.preserve_format}
#: the tagged arguments and what each tag's value may be
_TAGGED = {"dtype": lambda v: v in _DTYPES, "memory_format": lambda v: v in _FORMATS, "layout": lambda v: v == "strided",
           "device": lambda v: v is None, "float": lambda v: isinstance(v, str), "config": lambda v: isinstance(v, str)}
#: the aten operations a described kernel's own code may apply without counting as a launch:
#: views and empty allocations (no kernel runs on a GPU)
VIEWS = frozenset({
    "aten::t", "aten::permute", "aten::transpose.int", "aten::view", "aten::_unsafe_view", "aten::expand",
    "aten::select.int", "aten::slice.Tensor", "aten::unsqueeze", "aten::squeeze.dim", "aten::squeeze.dims",
    "aten::alias", "aten::as_strided", "aten::narrow", "aten::split.Tensor", "aten::unbind.int",
    "aten::empty.memory_format", "aten::empty_strided", "aten::unflatten.int", "aten::movedim.int",
    "aten::detach",  # an alias of its input (torch records one after a factory call such as torch.empty)
})
#: aten operations no description may hold: they reach outside the tensors (a file)
REFUSED = frozenset({"aten::from_file"})


class ProgramError(ValueError):
    """A kernel that cannot be described, or a description that is not well formed (one
    clear line)."""


@dataclass
class Program:
    """inputs: (name, spec) per input value, in value order: a tensor spec is {"shape",
    "stride", "dtype"}, a plain value is {"value": x}. steps: {"kind", "name", "args",
    "kwargs", "outs"}; outs is an argument structure of the values the step made. prepared
    / outputs: what prepare() and run() returned, names to arguments."""

    inputs: list[tuple[str, dict]] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    prepared: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)
    n_values: int = 0
    #: the first this many steps are prepare()'s (run once, before timing), the rest run()'s
    prepare_steps: int = 0

    def to_json(self) -> str:
        return json.dumps({"inputs": self.inputs, "steps": self.steps, "prepared": self.prepared,
                           "outputs": self.outputs, "n_values": self.n_values, "prepare_steps": self.prepare_steps})

    def run_steps(self) -> list[dict]:
        """run()'s steps: what a launch check judges."""
        return self.steps[self.prepare_steps:]

    @classmethod
    def from_json(cls, text: str) -> "Program":
        try:
            d = json.loads(text)
            program = cls(inputs=[(str(n), dict(s)) for n, s in d["inputs"]], steps=list(d["steps"]),
                          prepared=dict(d["prepared"]), outputs=dict(d["outputs"]), n_values=int(d["n_values"]),
                          prepare_steps=int(d["prepare_steps"]))
            program.check()
        except ProgramError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as e:  # a step of the wrong shape too
            raise ProgramError(f"not a kernel program: {type(e).__name__}: {str(e)[:200]}") from None
        return program

    def check(self) -> None:
        """Each step of a known kind reads only values made before it and makes new ones in
        order; bounded in size."""
        if len(self.steps) > MAX_STEPS:
            raise ProgramError(f"more than {MAX_STEPS} steps")
        if not 0 <= self.prepare_steps <= len(self.steps):
            raise ProgramError("prepare_steps is not a count of the steps")
        made = len(self.inputs)
        # where each value comes from, followed through views: an input, prepare()'s work, a
        # bare allocation, or run()'s own (its fused GEMMs and finishing steps; its torch
        # compute, which the launch check counts)
        origin = ["input"] * made

        def refs(a, depth=0):
            if depth > 8:
                raise ProgramError("arguments nested too deeply")
            if isinstance(a, list):
                raise ProgramError("a bare list in arguments")
            if isinstance(a, dict):
                if set(a) == {"v"}:
                    yield a["v"]
                elif set(a) == {"list"} and isinstance(a["list"], list):
                    for x in a["list"]:
                        yield from refs(x, depth + 1)
                elif set(a) == {"dict"} and isinstance(a["dict"], dict):
                    for x in a["dict"].values():
                        yield from refs(x, depth + 1)
                elif not (len(a) == 1 and _TAGGED.get(next(iter(a)), lambda v: False)(next(iter(a.values())))):
                    raise ProgramError(f"unknown argument {str(a)[:80]}")
            elif not (a is None or type(a) in (int, float, bool, str)):
                raise ProgramError(f"unknown argument {str(a)[:80]}")

        for i, step in enumerate(self.steps):
            if not isinstance(step, dict) or set(step) != {"kind", "name", "args", "kwargs", "outs"} \
                    or step["kind"] not in KINDS or not isinstance(step["name"], str) \
                    or not isinstance(step["args"], list) or not isinstance(step["kwargs"], dict):
                raise ProgramError(f"step {i} is not a step")
            if step["kind"] == "aten" and (not _ATEN.match(step["name"]) or step["name"] in REFUSED):
                raise ProgramError(f"step {i}: {step['name'][:80]!r} is not an aten operation a kernel may use")
            read = [*refs({"list": step["args"]})]
            for v in [*read, *refs({"dict": step["kwargs"]})]:
                if not (type(v) is int and 0 <= v < made):
                    raise ProgramError(f"step {i} reads a value not made before it")
            if i < self.prepare_steps:
                kind = "prepare"
            elif step["kind"] == "aten" and step["name"].startswith("aten::empty"):
                kind = "allocation"
            elif step["kind"] == "aten" and step["name"] in VIEWS and read:
                kind = origin[read[0]]  # a view is what it views
            else:
                kind = "run"
            for v in refs(step["outs"]):
                if v != made:
                    raise ProgramError(f"step {i} does not make its values in order")
                made += 1
                origin.append(kind)
        if made != self.n_values:
            raise ProgramError("n_values does not count the values made")
        for what in (self.prepared, self.outputs):
            for v in refs({"dict": what}):
                if not (type(v) is int and 0 <= v < made):
                    raise ProgramError("a result that is no value")
        plain = {i for i, (_, spec) in enumerate(self.inputs) if isinstance(spec, dict) and "value" in spec}
        said = {"input": "an input", "prepare": "made in prepare()", "allocation": "a bare allocation"}
        for name, out in self.outputs.items():
            for v in refs(out):
                if origin[v] in said and v not in plain:
                    raise ProgramError(f"output {name!r} is {said[origin[v]]} (or a view of one), not made by run()'s "
                                       "fused GEMMs or finishing steps")


# ---- describing -----------------------------------------------------------------------

_describer: "_Describer | None" = None


def describing() -> bool:
    """True while describe() runs a kernel (the primitives then record instead of running)."""
    return _describer is not None


class _Describer(TorchDispatchMode):
    """Numbers the fake tensors, records the kernel's own aten operations (those outside
    any primitive call) and the primitive calls."""

    def __init__(self):
        super().__init__()
        self.program = Program()
        self.ids: dict[int, int] = {}
        self.alive: list[torch.Tensor] = []  # numbered tensors stay alive: ids are never reused
        self.depth = 0

    def value(self, t: torch.Tensor) -> int:
        self.ids[id(t)] = self.program.n_values
        self.alive.append(t)
        self.program.n_values += 1
        return self.program.n_values - 1

    def encode(self, x, depth: int = 0):
        if depth > 8:
            raise ProgramError("an argument nested too deeply")
        if isinstance(x, torch.Tensor):
            if id(x) not in self.ids:
                raise ProgramError("a tensor the program did not make (a module-level tensor, or one made "
                                   "outside torch)")
            return {"v": self.ids[id(x)]}
        if x is None or type(x) in (int, bool, str):
            return x
        if type(x) is float:
            return x if math.isfinite(x) else {"float": x.hex()}
        if isinstance(x, (list, tuple)):
            return {"list": [self.encode(v, depth + 1) for v in x]}
        if isinstance(x, dict):
            if not all(type(k) is str for k in x):
                raise ProgramError("a dict argument with keys that are not strings")
            return {"dict": {k: self.encode(v, depth + 1) for k, v in x.items()}}
        if isinstance(x, torch.dtype) and str(x).removeprefix("torch.") in _DTYPES:
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"device": None}
        if isinstance(x, torch.memory_format) and str(x).removeprefix("torch.") in _FORMATS:
            return {"memory_format": str(x).removeprefix("torch.")}
        if x is torch.strided:
            return {"layout": "strided"}
        from epiforge.primitives.config import GemmConfig

        if isinstance(x, GemmConfig):
            return {"config": x.key()}
        raise ProgramError(f"an argument of type {type(x).__name__} cannot be described")

    def made(self, out):
        """Number the tensors a step made (a tensor, or lists / tuples / dicts of them)."""
        if isinstance(out, torch.Tensor):
            return {"v": self.value(out)}
        if isinstance(out, (list, tuple)):
            return {"list": [self.made(v) for v in out]}
        if isinstance(out, dict):
            return {"dict": {str(k): self.made(v) for k, v in out.items()}}
        return self.encode(out)

    def add(self, kind: str, name: str, args, kwargs, out):
        if len(self.program.steps) >= MAX_STEPS:
            raise ProgramError(f"the kernel made more than {MAX_STEPS} calls")
        step = {"kind": kind, "name": name, "args": self.encode(list(args))["list"],
                "kwargs": self.encode(dict(kwargs))["dict"], "outs": self.made(out)}
        self.program.steps.append(step)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.depth == 0 and func.namespace != "prim":  # prim::device and the like: metadata reads, no work
            self.add("aten", func.name(), args, kwargs, out)
        return out


class _DeviceFreeBindings(TorchFunctionMode):
    """Tensor methods whose Python bindings enter a device guard before they reach the
    dispatcher (indexing, contiguous, to, cuda, as_tensor of a tensor): a guard on a GPU's fake value needs a
    CUDA runtime, which a describer need not have. Each is done here with the aten
    operations it dispatches to anyway (what the description then records), so that a kernel
    is described for a GPU on any machine."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        own = _BINDINGS.get(func)
        if own is None or not isinstance(args[0], torch.Tensor):
            return func(*args, **kwargs)
        return own(*args, **kwargs)


def _basic_view(x: torch.Tensor, index):
    """x[index] for ints, slices, None and Ellipsis (a view); None for any other index."""
    index = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or type(i) in (int, slice) for i in index) or \
            sum(i is Ellipsis for i in index) > 1:
        return None
    consumed = sum(type(i) in (int, slice) for i in index)
    if consumed > x.dim():
        raise IndexError(f"too many indices for a tensor of dimension {x.dim()}")
    if Ellipsis in index:  # as many full slices as the dimensions the other items leave
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (x.dim() - consumed) + index[k + 1:]
    aten, d = torch.ops.aten, 0
    for i in index:
        if i is None:
            x, d = aten.unsqueeze(x, d), d + 1
        elif type(i) is int:
            if not -x.shape[d] <= i < x.shape[d]:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {x.shape[d]}")
            x = aten.select.int(x, d, i)
        else:
            x, d = aten.slice.Tensor(x, d, i.start, i.stop, 1 if i.step is None else i.step), d + 1
    return x


def _advanced_indices(x: torch.Tensor, index):
    """aten.index's list for an index of tensors and full slices; None for any other."""
    index = index if isinstance(index, tuple) else (index,)
    full = slice(None)
    if not any(isinstance(i, torch.Tensor) for i in index) or \
            not all(isinstance(i, torch.Tensor) or i == full for i in index) or len(index) > x.dim():
        return None
    return [i if isinstance(i, torch.Tensor) else None for i in index]


def _indexed(x, index):
    """(the view x[index], None) for a basic index, (None, aten.index's list) for tensors;
    ProgramError for any other index."""
    view = _basic_view(x, index)
    indices = None if view is not None else _advanced_indices(x, index)
    if view is None and indices is None:
        raise ProgramError("an index of this form cannot be described: use ints, slices, None, ... or tensors")
    return view, indices


def _getitem(x, index):
    view, indices = _indexed(x, index)
    return view if view is not None else torch.ops.aten.index.Tensor(x, indices)


def _setitem(x, index, value):
    view, indices = _indexed(x, index)
    if view is not None:
        if isinstance(value, torch.Tensor):
            torch.ops.aten.copy_(view, value)
        else:
            torch.ops.aten.fill_.Scalar(view, value)
        return None
    value = value if isinstance(value, torch.Tensor) else torch.full((), value, dtype=x.dtype, device=x.device)
    torch.ops.aten.index_put_(x, indices, value)
    return None


def _contiguous(x, memory_format=torch.contiguous_format):
    return x if x.is_contiguous(memory_format=memory_format) else torch.ops.aten.clone(x, memory_format=memory_format)


def _to(x, *args, **kwargs):
    copy = kwargs.pop("copy", False)
    device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    device = x.device if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    dtype = x.dtype if dtype is None else dtype
    if not copy and device == x.device and dtype == x.dtype and memory_format in (None, torch.preserve_format):
        return x
    return torch.ops.aten._to_copy(x, dtype=dtype, device=device,
                                   memory_format=torch.preserve_format if memory_format is None else memory_format)


def _as_tensor(data, dtype=None, device=None):
    return _to(data, **{k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None})


#: the bindings _DeviceFreeBindings does itself
_BINDINGS = {
    torch.Tensor.__getitem__: _getitem, torch.Tensor.__setitem__: _setitem, torch.Tensor.contiguous: _contiguous,
    torch.Tensor.to: _to, torch.Tensor.cuda: lambda x, device=None, non_blocking=False: _to(x, device or "cuda"),
    torch.Tensor.cpu: lambda x: _to(x, "cpu"), torch.as_tensor: _as_tensor,
}


def primitive_call(kind: str, name: str, fn, args: tuple, kwargs: dict):
    """The seam the primitives call through: outside describe() it is fn(*args, **kwargs);
    inside, the call is recorded as one step of `kind` and `name` and runs on the fake
    tensors (to make its outputs' shapes) without recording what it does inside."""
    d = _describer
    if d is None or d.depth > 0:
        return fn(*args, **kwargs)
    d.depth += 1
    try:
        out = fn(*args, **kwargs)
    finally:
        d.depth -= 1
    d.add(kind, name, args, kwargs, out)
    return out


@contextmanager
def not_the_kernels():
    """Torch work the primitives do for themselves while a kernel is described (importing
    quack, whose modules make tensors) is not recorded as the kernel's."""
    d = _describer
    if d is not None:
        d.depth += 1
    try:
        yield
    finally:
        if d is not None:
            d.depth -= 1


def epilogue_name(epi) -> str:
    """How a gemm step names its epilogue: a quack library target ("quack.<module>:<name>"
    and its declared operands) or the epilogue's declarations and traced graph, as JSON."""
    from dataclasses import asdict

    def kinds(d):
        return {k: {"kind": type(v).__name__, **asdict(v)} for k, v in d.items()}

    if epi.from_library:
        target = epi.library_target
        if target is None:
            raise ProgramError(f"{epi.name}: a library epilogue must be named as P.from_quack('quack.<module>:<name>')")
        return json.dumps({"library": target, "operands": kinds(epi.library_operands or {})})
    from epiforge.primitives.epilogue import EpilogueError

    try:
        traced = _graph.trace(epi)
    except _graph.GraphError as e:  # what cannot be traced cannot be built either: the kernel's compile error
        raise EpilogueError(f"{epi.name}(): its body cannot be built for sm_90a: {e}") from None
    return json.dumps({"graph": json.loads(traced.to_json()), "name": epi.name, "outputs": list(epi.outputs),
                       "operands": kinds(epi.operands), "reductions": kinds(epi.reductions), "mode": epi.mode,
                       "pair_outputs": list(epi.pair_outputs)})


def _fake(spec: dict, device: str) -> torch.Tensor:
    """An input as the kernel sees it while described: shape, strides, dtype and the judge's
    device, no values (made inside describe()'s FakeTensorMode)."""
    return torch.empty_strided(spec["shape"], spec["stride"], dtype=_DTYPES[spec["dtype"]], device=device)


def spec_of(value) -> dict:
    """What describe() needs of an input: a tensor's shape, strides and dtype, or a plain value."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ProgramError(f"an input of dtype {dtype}")
        return {"shape": list(value.shape), "stride": list(value.stride()), "dtype": dtype}
    if value is None or type(value) in (int, float, bool, str):
        return {"value": value}
    raise ProgramError(f"an input of type {type(value).__name__}")


def describe(module, specs: dict[str, dict], constants: tuple[str, ...], device: str = "cpu") -> Program:
    """Run the kernel module's prepare(consts) (if it has one: consts are the inputs named in
    `constants`) and run(inputs, prepared) on fake tensors of `specs` (spec_of) on `device`
    ("cpu" or "cuda": the judge's, which a kernel sees as it would when run there; no GPU is
    needed), recording every step. Raises ProgramError for a kernel that reads a value or
    passes something that cannot be described; whatever else the kernel's code raises (an
    EpilogueError: a call that does not fit its epilogue's declarations) as it is, as
    running the kernel would."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

    from epiforge.primitives.epilogue import EpilogueError

    global _describer
    if _describer is not None:
        raise ProgramError("describe() inside describe()")
    if device not in ("cpu", "cuda"):
        raise ProgramError(f"a description is for the cpu or cuda, not {device!r}")
    d = _Describer()
    values = {}
    fake = FakeTensorMode()
    for name, spec in specs.items():
        d.program.inputs.append((name, spec))
        if "value" in spec:
            values[name] = spec["value"]
            d.program.n_values += 1  # a plain input is a value too, never read by number
        else:
            with fake:
                values[name] = _fake(spec, device)
            d.value(values[name])
    _describer = d
    try:
        # a factory call without a device makes its tensor on the judge's device, like every
        # other value here (the description runs there, whatever the kernel's code assumed)
        with fake, torch.device(device), _DeviceFreeBindings(), d:
            consts = {k: values[k] for k in constants}
            prepared = module.prepare(consts) if hasattr(module, "prepare") else {}
            if not isinstance(prepared, dict):
                raise ProgramError("prepare() must return a dict")
            d.program.prepared = d.encode(prepared)["dict"]
            d.program.prepare_steps = len(d.program.steps)
            out = module.run(dict(values), MappingProxyType(prepared))  # read-only, as the runner passes it
            if not isinstance(out, dict):
                raise ProgramError("run() must return a dict")
            d.program.outputs = d.encode(out)["dict"]
    except ProgramError:
        raise
    except EpilogueError:  # a call or declaration off the contract: the kernel's compile error, as when it runs
        raise
    except (NotImplementedError, DataDependentOutputException, DynamicOutputShapeException) as e:
        raise ProgramError(f"the kernel read a tensor's values while being described: {str(e)[:200]}") from None
    except Exception as e:  # the kernel's own exception: as it is, as running the kernel would raise it
        if "meta tensor" in str(e) or "FakeTensor" in str(e):  # .item(), float(t), .tolist(), .numpy() ...
            raise ProgramError(f"the kernel read a tensor's values while being described: {str(e)[:200]}") from None
        raise
    finally:
        _describer = None
    d.program.check()
    return d.program


# ---- executing ------------------------------------------------------------------------

def own_compute(steps_run: list[str]) -> list[str]:
    """The aten operations among the steps a run() ran (Executable.run) that are not views
    or allocations: torch work of the kernel's own, one launch each on a GPU."""
    return [step.removeprefix("aten:") for step in steps_run
            if step.startswith("aten:") and step.removeprefix("aten:") not in VIEWS]


def execute(program: Program, values: dict) -> tuple[dict, list[str]]:
    """Run the program once on real inputs (names as in program.inputs): prepare()'s steps,
    then run()'s. Returns (run()'s outputs, the steps run as "<kind>:<name>")."""
    runnable = Executable(program)
    return runnable.run(runnable.prepare(values))


class Executable:
    """A checked program (Program.from_json or describe()), ready to run with the
    primitives' code: prepare() once per input set, run() as often as a judge calls it
    (each call makes new output tensors). What each step calls is looked up once, here: a
    step names only aten operations, registered finishing steps, prepare helpers and
    epilogues built from their descriptions (ProgramError for anything else)."""

    def __init__(self, program: Program):
        self.program = program
        epilogues: dict[str, object] = {}
        self.calls = []  # per step: (what to call, how it is counted)
        for step in program.steps:
            kind, name = step["kind"], step["name"]
            if kind == "gemm":
                if name not in epilogues:
                    epilogues[name] = _epilogue_from(name)
                self.calls.append((epilogues[name], f"gemm:{epilogues[name].name}"))
            else:
                self.calls.append((_resolve(kind, name), f"{kind}:{name}"))

    def prepare(self, values: dict) -> list:
        """The value table after prepare()'s steps: the inputs, then what those steps made."""
        table: list = []
        for name, _spec in self.program.inputs:
            if name not in values:
                raise ProgramError(f"no input {name!r}")
            table.append(values[name])
        self._steps(range(self.program.prepare_steps), table)
        return table

    def prepared(self, table: list) -> dict:
        """What the kernel's prepare() returned, as values of the table prepare() made."""
        return {k: _arg(v, table, _device(table)) for k, v in self.program.prepared.items()}

    def run(self, prepared: list) -> tuple[dict, list[str]]:
        """run()'s steps on a copy of the table prepare() made: (outputs, the steps run as
        "<kind>:<name>", aten ones by their op name, gemm ones by their epilogue's name)."""
        table = list(prepared)
        done = self._steps(range(self.program.prepare_steps, len(self.program.steps)), table)
        return {k: _arg(v, table, _device(table)) for k, v in self.program.outputs.items()}, done

    def _steps(self, which: range, table: list) -> list[str]:
        device, done = _device(table), []
        for i in which:
            step, (fn, counted) = self.program.steps[i], self.calls[i]
            out = fn(*[_arg(a, table, device) for a in step["args"]],
                     **{k: _arg(v, table, device) for k, v in step["kwargs"].items()})
            done.append(counted)
            _keep(step["outs"], out, table)
        return done


def _resolve(kind: str, name: str):
    """The function an aten, finish or prepare step names, looked up in its registry only."""
    from epiforge.primitives import finish, prepare

    if kind == "aten":
        op_name, _, overload = name.removeprefix("aten::").partition(".")
        packet = getattr(torch.ops.aten, op_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None:
            raise ProgramError(f"unknown aten operation {name!r}")
        return op
    if kind == "finish":
        if name not in finish.STEPS:
            raise ProgramError(f"unknown finishing step {name!r}")
        return functools.partial(finish._run, name)
    if name not in prepare.HELPERS:
        raise ProgramError(f"unknown prepare helper {name!r}")
    return prepare.HELPERS[name]


def _device(table: list) -> torch.device:
    return next((v.device for v in table if isinstance(v, torch.Tensor)), torch.device("cpu"))


def _arg(a, table: list, device):
    """An argument of the description as the value it names."""
    if isinstance(a, dict):
        (tag, v), = a.items()
        if tag == "v":
            return table[v]
        if tag == "list":
            return [_arg(x, table, device) for x in v]
        if tag == "dict":
            return {k: _arg(x, table, device) for k, x in v.items()}
        if tag == "dtype":
            return _DTYPES[v]
        if tag == "config":
            from epiforge.primitives.config import GemmConfig

            return GemmConfig.parse(v)
        if tag == "float":
            return float.fromhex(v)
        if tag == "memory_format":
            return _FORMATS[v]
        if tag == "device":
            return device
        if tag == "layout":
            return torch.strided
    return a


def _keep(outs, out, table: list) -> None:
    """Append what a step made to the table, in the order its description numbers it."""
    if isinstance(outs, dict) and set(outs) == {"v"}:
        table.append(out)
    elif isinstance(outs, dict) and "list" in outs:
        if not isinstance(out, (list, tuple)) or len(out) != len(outs["list"]):
            raise ProgramError("a step made other values than its description says")
        for o, x in zip(outs["list"], out):
            _keep(o, x, table)
    elif isinstance(outs, dict) and "dict" in outs:
        if not isinstance(out, dict) or set(out) != set(outs["dict"]):
            raise ProgramError("a step made other values than its description says")
        for k, o in outs["dict"].items():
            _keep(o, out[k], table)


def _epilogue_from(text: str):
    """The Epilogue a gemm step names (epilogue_name's JSON), built by the primitives."""
    from epiforge import primitives as P
    from epiforge.primitives import spec as S
    from epiforge.primitives.epilogue import Epilogue

    kinds = {c.__name__: c for c in (S.PerRow, S.PerCol, S.Scalar, S.Tile, S.HeadRMS, S.RowReduce, S.ColReduce,
                                     S.RowLogSumExp, S.RowSelect)}

    def declared(d: dict) -> dict:
        out = {}
        for k, v in d.items():
            v = dict(v)
            cls = kinds.get(v.pop("kind", None))
            if cls is None:
                raise ProgramError(f"unknown declaration in {text[:80]}")
            out[k] = cls(**v)
        return out

    try:
        d = json.loads(text)
        if "library" in d:
            return P.from_quack(d["library"], operands=declared(d["operands"]) or None)
        g = _graph.Graph.from_json(json.dumps(d["graph"]))
        shape = Epilogue(fn=_graph.as_function(g), outputs=tuple(d["outputs"]), operands=declared(d["operands"]),
                         reductions=declared(d["reductions"]), mode=d["mode"], pair_outputs=tuple(d["pair_outputs"]))
        shape.name = str(d["name"])
        return _graph.rebuild(g, shape)
    except ProgramError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed description is the describer's failure
        raise ProgramError(f"not an epilogue: {type(e).__name__}: {str(e)[:200]}") from None

