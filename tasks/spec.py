"""Task: what a kernel must compute. One folder per task under tasks/: `task.toml` (the
spec, validated here) and `reference.py` (`make_inputs` and the torch `reference`).

A kernel is judged against two references of the same code (Task.reference): the exact
one (float64) and the low-precision one an honest fused kernel matches (float32
accumulation and epilogue, one rounding per output), whose error sets the allowance
(Tolerance, after CODA v0.1's rule). Task.unfused is the plain bf16 pipeline: the
baseline that is timed, not a reference for correctness.

Defined once, here: TensorSpec, ScalarSpec, Tolerance, GemmDims, Task, ShapeSet.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from epiforge.primitives.finish import FINISHERS
from epiforge.tasks import common
from epiforge.tasks import dims as dimexpr

TASKS_DIR = Path(__file__).resolve().parent
#: the task API this epiforge reads (tasks/AUTHORING.md, "Versions"). 2: reference(inputs, dims,
#: mm=) computes the fused GEMM as mm(a, b), a task of several GEMMs takes store= too, and
#: make_inputs(dims, gen, device, dtype=) draws the "precision" tensors in dtype. 1 (a folder
#: with no `api` key): reference(inputs, dims) and make_inputs(dims, gen, device).
TASK_API = 2
#: more folders of task folders, os.pathsep-separated (tasks written outside the repo, and tests)
ENV_TASKS_PATH = "EPIFORGE_TASKS_PATH"
DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
}
DTypeName = Literal["bfloat16", "float16", "float32", "int32", "int64"]
#: the precisions a task may run in (its `dtypes`); a tensor written `dtype = "precision"`
#: in task.toml takes the one of the run (Task.at), every other tensor keeps its dtype
PRECISIONS = ("bfloat16", "float16")
Precision = Literal["bfloat16", "float16"]
PRECISION = "precision"
#: symbols a shape may use (the columns of tasks/shapes.toml)
DIMENSIONS = ("M", "seq", "d", "F", "V", "head_dim")


def _floating(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def task_dirs() -> tuple[Path, ...]:
    """Where task folders are looked for: tasks/, then each folder named in $EPIFORGE_TASKS_PATH."""
    extra = [Path(p) for p in os.environ.get(ENV_TASKS_PATH, "").split(os.pathsep) if p]
    return (TASKS_DIR, *extra)


def task_order(name: str) -> list:
    """Sort key of a task id or name, digits as numbers: k2 before k10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _known_dims(expr: str) -> str:
    unknown = dimexpr.symbols(expr) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown dimension(s) {sorted(unknown)} in {expr!r}; known: {DIMENSIONS}")
    return expr


def is_gemm_launch(entry: str) -> bool:
    """A `launches` entry that is a fused GEMM: "gemm" (a task of one) or "gemm:<name>"."""
    return entry == "gemm" or entry.startswith("gemm:")


class TaskError(ValueError):
    """A malformed or unknown task: the message is one line naming the file and the field."""


class TaskCodeError(TaskError):
    """The task's own code (reference.py) raised or returned the wrong thing: the task's
    fault, never the kernel's (the judge reports it as TASK_ERROR)."""

    def __init__(self, file: Path, detail: str):
        self.file, self.detail = file, detail
        super().__init__(f"{file}: {detail}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """A named tensor the kernel reads or writes."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    shape: list[str] = Field(min_length=1, description="dimension expressions, e.g. ['M', '2*F']")
    dtype: DTypeName
    description: str
    layout: Literal["row-major"] = "row-major"
    """How the tensor lies in memory: row-major and contiguous. Every input is given so, and
    every output is checked to come back so (the right values in another layout are a wrong
    output)."""
    arrangement: str = ""
    """What lies where, in words, for a reader (interleaved columns, a fused weight's rows);
    the reference defines it, nothing checks the words."""
    constant: bool = Field(False, description="weight-like: fixed across steps; a kernel's prepare() may read it")
    follows_precision: bool = Field(False, description='dtype = "precision" in task.toml: the run\'s precision, '
                                                       "one of the task's dtypes (dtype holds the one resolved)")

    @field_validator("shape")
    @classmethod
    def _known_dims(cls, shape):
        return [_known_dims(e) for e in shape]

    @model_validator(mode="before")
    @classmethod
    def _prose_layout(cls, data):
        """Folders written before the layout was typed said it in words: "row-major,
        contiguous" is the layout; other words (e.g. "columns interleaved ...") described
        the arrangement, and the tensor is held to row-major contiguous like any other."""
        if isinstance(data, dict) and isinstance(data.get("layout"), str) and data["layout"] != "row-major":
            data = dict(data)
            words = data.pop("layout").strip()
            if words.replace(" ", "").lower() != "row-major,contiguous":
                if data.get("arrangement"):
                    raise ValueError(f"layout {words!r}: a layout is \"row-major\"; say the rest in arrangement")
                if any(w in words.lower().replace("-", " ") for w in ("column major", "col major", "transpose",
                                                                       "fortran", "strided")):
                    raise ValueError(f"layout {words!r}: tensors are row-major and contiguous (layout = "
                                     "\"row-major\"); a transposed operand of a GEMM is gemm.a_layout / b_layout")
                data["arrangement"] = words
        return data

    @property
    def layout_text(self) -> str:
        """The layout as a reader is told it: the arrangement where there is one."""
        return self.arrangement or "row-major, contiguous"

    def concrete_shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(dimexpr.evaluate(e, dims) for e in self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


class ScalarSpec(_Strict):
    """A named constant passed to the kernel as a Python number (e.g. RMSNorm's eps)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    value: float
    description: str


class Tolerance(_Strict):
    """max|out - ref| <= factor * max|ref_lowprec - ref| + atol, the same on the
    root-mean-square error (`rms_factor`), and element by element (`element_floor`); NaN or
    Inf never pass. ref is the reference in
    `reference_dtype`; ref_lowprec what an honest fused kernel computes from the inputs as
    given (Task.reference(exact=False)): the GEMM accumulated in float32, the epilogue and
    its reductions in float32 from the unrounded values, each output rounded once to its
    dtype. That is CODA v0.1's test rule (kernels/tests/gpt.py: factor 2, atol 1e-6, its
    references use torch.mm(..., out_dtype=float32)). So a float32 output (rstd, lse, loss,
    zdz, dw) is held to float32 accuracy, and a bf16 one to about one rounding. The RMS
    guard catches a systematic error the max rule lets through (a 1% scale error at bf16,
    tests/human_kernels/test_expert_kernels.py): a kernel that rounds once is no worse in RMS either.
    The element rule catches what both global rules let through, a wrong value where the
    values are small (every |y| < 0.01 flushed to zero):
        |out_i - ref_i| <= factor * (|lowprec_i - ref_i| + ulp_i) + element_floor * s + atol
    for every element i, where ulp_i is one unit in the last place of the output's dtype at
    ref_i (the rounding an honest kernel may land on the other side of) and s the RMS of the
    low-precision reference's error before its rounding to the output's dtype (the float32
    arithmetic's own error, which an honest kernel's differs from in order, not in size).
    The margins every expert and honest kernel keeps under it: lab/results/tolerance-margins/ (README)."""

    factor: float = Field(2.0, gt=0)
    atol: float = Field(1e-6, ge=0)
    rms_factor: float | None = Field(2.0, gt=0, description="None turns the RMS guard off")
    element_floor: float | None = Field(16.0, gt=0, description="the element rule's floor, in units of the "
                                        "low-precision reference's unrounded RMS error; None turns the rule off")


class OutputSpec(TensorSpec):
    tolerance: Tolerance = Tolerance()
    sum_over_rows: bool = Field(False, description="a sum over the tokens (M) of per-token terms, as a weight "
                                "gradient is: its references can be made for blocks of rows and added "
                                "(tasks/tolerance_margins --row-blocks); no dimension of it is M")

    @model_validator(mode="after")
    def _sum_has_no_rows(self):
        if self.sum_over_rows and any("M" in dimexpr.symbols(e) for e in self.shape):
            raise ValueError(f"output {self.name}: sum_over_rows, but its shape {self.shape} has M in it")
        return self


class GemmDims(_Strict):
    """A fused GEMM: D (m x n) = A (m x k) @ B (k x n). In a one-GEMM task ([gemm]) A and B
    are named inputs; in a task of several ([gemms.<name>]) either may be a tensor the task
    makes on the way (a stored intermediate), named for the reader.
    b_layout "nk": B is given as (n, k), nn.Linear's layout (D = A @ B^T); "kn": as (k, n)
    (a dgrad GEMM reading a forward weight: D = A @ B). a_layout "mk": A is given as (m, k);
    "km": as (k, m) (a weight-gradient GEMM reading activations: D = X^T @ Y)."""

    m: str
    n: str
    k: str
    a: str = Field(description="the tensor that is the GEMM's A")
    b: str = Field(description="the tensor that is the GEMM's B")
    b_layout: Literal["nk", "kn"] = "nk"
    a_layout: Literal["mk", "km"] = "mk"

    @field_validator("m", "n", "k")
    @classmethod
    def _expr(cls, e):
        return _known_dims(e)


class ShapeSet(_Strict):
    """One row of tasks/shapes.toml: concrete model dimensions."""

    name: str
    M: int = Field(gt=0)
    seq: int = Field(gt=0)
    d: int = Field(gt=0)
    F: int = Field(gt=0)
    V: int = Field(gt=0)
    head_dim: int = Field(gt=0)

    @model_validator(mode="after")
    def _consistent(self):
        if self.M % self.seq:
            raise ValueError(f"M={self.M} is not a whole number of sequences of {self.seq}")
        if self.d % self.head_dim:
            raise ValueError(f"d={self.d} is not a whole number of heads of {self.head_dim}")
        return self

    def dims(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in DIMENSIONS}


class Task(_Strict):
    """A task spec plus access to its reference module."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="short id: lowercase letters, digits, _")
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="the folder's name: the id, or the id + '_' + words")
    title: str
    description: str
    gemm: GemmDims | None = Field(None, description="the one fused GEMM (a task of several names them in gemms)")
    gemms: dict[str, GemmDims] = Field({}, description="a task of several fused GEMMs: each by name, in the order "
                                                       "the computation needs them (launches names each once)")
    inputs: list[TensorSpec] = Field(min_length=1)
    scalars: list[ScalarSpec] = []
    outputs: list[OutputSpec] = Field(min_length=1)
    launches: list[str] = Field(min_length=1, description="the fused GEMMs ('gemm', or 'gemm:<name>' for each of "
                                                          "gemms) and the named finishing steps, in order")
    api: int | None = Field(None, ge=1, description="the task API the folder was written to (TASK_API; "
                                                    "none: read from its functions' parameters)")
    reference_dtype: Literal["float64", "float32"] = "float64"
    dtypes: list[Precision] = Field(["bfloat16"], min_length=1,
                                    description="the precisions the task runs in, the first its default")
    precision: Precision = Field("bfloat16", description="the precision this Task is resolved to (Task.at); "
                                                         "set by the loader, not in task.toml")
    folder: Path = Field(exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _resolve_precision(cls, data):
        """Each `dtype = "precision"` tensor takes the first of `dtypes` (Task.at gives the others)."""
        if not isinstance(data, dict):
            return data
        if "precision" in data:
            raise ValueError('precision: not a task.toml key; list the precisions in dtypes and write '
                             'dtype = "precision" on the tensors that follow them')
        dtypes = data.get("dtypes", ["bfloat16"])
        first = dtypes[0] if isinstance(dtypes, list) and dtypes and dtypes[0] in PRECISIONS else "bfloat16"
        data = {**data, "precision": first}
        for group in ("inputs", "outputs"):
            rows = data.get(group)
            if not isinstance(rows, list):
                continue
            resolved = []
            for row in rows:
                if isinstance(row, dict) and "follows_precision" in row:
                    raise ValueError(f'{group}: follows_precision is not a task.toml key; write dtype = "precision"')
                if isinstance(row, dict) and row.get("dtype") == PRECISION:
                    row = {**row, "dtype": first, "follows_precision": True}
                resolved.append(row)
            data[group] = resolved
        return data

    @field_validator("api")
    @classmethod
    def _known_api(cls, api):
        if api is not None and api > TASK_API:
            raise ValueError(f"written to task API {api}; this epiforge reads API {TASK_API} and older: update "
                             "epiforge (a newer checkout)")
        return api

    @model_validator(mode="after")
    def _precisions(self):
        if len(set(self.dtypes)) != len(self.dtypes):
            raise ValueError(f"dtypes: {self.dtypes} lists a precision twice")
        if len(self.dtypes) > 1 and not self.follows_precision:
            raise ValueError(f'dtypes: {self.dtypes} lists several precisions but no tensor has dtype = "precision"')
        for where, g in self.gemm_list:
            a, b = (next((t for t in self.inputs if t.name == getattr(g, r)), None) for r in ("a", "b"))
            if a is not None and b is not None and (a.dtype, a.follows_precision) != (b.dtype, b.follows_precision):
                raise ValueError(f"{where}: a ({a.name}) and b ({b.name}) must have one dtype: both \"precision\" "
                                 "or both the same")
        return self

    @property
    def follows_precision(self) -> bool:
        """Some tensor takes the run's precision (so make_inputs is handed it)."""
        return any(t.follows_precision for t in [*self.inputs, *self.outputs])

    def at(self, precision: str) -> "Task":
        """This task in one of its dtypes: each `dtype = "precision"` tensor takes it."""
        if precision not in self.dtypes:
            raise TaskError(f"{self.name} runs in {', '.join(self.dtypes)}, not {precision}")
        if precision == self.precision:
            return self

        def resolve(specs):
            return [t.model_copy(update={"dtype": precision}) if t.follows_precision else t for t in specs]

        return self.model_copy(update={"precision": precision, "inputs": resolve(self.inputs),
                                       "outputs": resolve(self.outputs)})

    @model_validator(mode="after")
    def _one_gemm_or_several(self):
        if (self.gemm is None) == (not self.gemms):
            raise ValueError("give the one fused GEMM as [gemm], or several as [gemms.<name>], not both or neither")
        if self.gemms and len(self.gemms) < 2:
            raise ValueError("gemms: a task of one GEMM gives it as [gemm]")
        for name in self.gemms:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"gemms: {name!r} must be lowercase letters, digits and _")
        return self

    @model_validator(mode="after")
    def _known_launches(self):
        launches = self.launches
        steps = [x for x in launches if not is_gemm_launch(x)]
        if self.gemm is not None:
            if launches[0] != "gemm" or launches.count("gemm") != 1 or any(x.startswith("gemm:") for x in launches):
                raise ValueError("launches: the first launch must be the one fused 'gemm'")
        else:
            named = [x.split(":", 1)[1] for x in launches if x.startswith("gemm:")]
            if "gemm" in launches or sorted(named) != sorted(self.gemms):
                raise ValueError(f"launches: name each of gemms once, as 'gemm:<name>' ({', '.join(self.gemms)}); "
                                 f"got {named}")
        unknown = set(steps) - set(FINISHERS)
        if unknown:
            raise ValueError(f"launches: unknown finishing step(s) {sorted(unknown)}; known: {sorted(FINISHERS)}")
        return self

    @field_validator("name")
    @classmethod
    def _name_starts_with_id(cls, name, info):
        tid = info.data.get("id")  # validated before the name (None if it failed)
        if tid is not None and name != tid and not name.startswith(tid + "_"):
            raise ValueError(f"{name!r} must be the id {tid!r} or start with {tid + '_'!r}")
        return name

    @model_validator(mode="after")
    def _gemm_operands_are_inputs(self):
        names = {t.name for t in self.inputs}
        for role in ("a", "b"):
            if self.gemm is not None and getattr(self.gemm, role) not in names:
                raise ValueError(f"gemm.{role} = {getattr(self.gemm, role)!r} is not an input")
        if self.gemm is not None and self.gemm.a_layout != "mk":
            raise ValueError("gemm.a_layout: a one-GEMM task reads A as (m, k)")
        return self

    # ---- the fused GEMMs ----------------------------------------------------------------

    @property
    def gemm_list(self) -> list[tuple[str, GemmDims]]:
        """Every fused GEMM as (where it is declared, its dims): [("gemm", ...)] for a task of
        one, [("gemms.<name>", ...), ...] for a task of several, in their declared order."""
        if self.gemm is not None:
            return [("gemm", self.gemm)]
        return [(f"gemms.{name}", g) for name, g in self.gemms.items()]

    @property
    def gemm_count(self) -> int:
        """How many fused GEMMs one run() launches (the launch check's allowance)."""
        return len(self.gemm_list)

    @property
    def tokens_in_rows(self) -> bool:
        """Some GEMM has M (the tokens) as its N or K: a weight gradient, reading activations
        transposed. M must then be a multiple of 8 (hidden shapes draw it so)."""
        return any("M" in dimexpr.symbols(e) for _, g in self.gemm_list for e in (g.n, g.k))

    @property
    def finishing_steps(self) -> list[str]:
        """The finishing steps `launches` allows, in order (repeats kept: each is one launch)."""
        return [x for x in self.launches if not is_gemm_launch(x)]

    @property
    def gemm_operand_inputs(self) -> set[str]:
        """The inputs some GEMM reads as A or B (the low-precision reference keeps them in
        their dtype: the GEMM reads them as given)."""
        names = {t.name for t in self.inputs}
        return {getattr(g, r) for _, g in self.gemm_list for r in ("a", "b")} & names

    @model_validator(mode="after")
    def _unique_names(self):
        names = [t.name for t in self.inputs] + [s.name for s in self.scalars] + [o.name for o in self.outputs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate names {sorted(dup)}")
        return self

    # ---- the reference module -------------------------------------------------------

    @cached_property
    def _module(self):
        """reference.py: imported as tasks.<name>.reference from tasks/, by path from elsewhere."""
        file = self.folder / "reference.py"
        try:
            if self.folder.parent == TASKS_DIR:
                return importlib.import_module(f"epiforge.tasks.{self.name}.reference")
            spec = importlib.util.spec_from_file_location(f"epiforge_tasks.{self.name}.reference", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        except (MemoryError, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - whatever the task's own code does is the task's fault
            raise TaskCodeError(file, f"importing it raised {_first_line(e)}") from None

    def _call(self, fn: str, *args, **kw):
        """reference.py's `fn`(*args); what it raises is the task's fault (TaskCodeError),
        except running out of memory (the machine's)."""
        file = self.folder / "reference.py"
        f = getattr(self._module, fn, None)
        if not callable(f):
            raise TaskCodeError(file, f"defines no {fn}()")
        try:
            out = f(*args, **kw)
        except (MemoryError, torch.OutOfMemoryError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001
            if _host_out_of_memory(e):
                raise MemoryError(f"out of memory in {fn}(): {_first_line(e)}") from None
            raise TaskCodeError(file, f"{fn}() raised {_first_line(e)}") from None
        if not isinstance(out, dict):
            raise TaskCodeError(file, f"{fn}() returned {type(out).__name__}, not a dict")
        return out

    def _run_reference(self, inputs: dict, dims: dict, **kw) -> dict:
        out = self._call("reference", inputs, dims, **kw)
        missing = [o.name for o in self.outputs if o.name not in out]
        if missing:
            raise TaskCodeError(self.folder / "reference.py", f"reference() returned no {missing}")
        return out

    def unfused(self, inputs: dict, dims: dict[str, int]) -> dict:
        """The plain PyTorch computation on the inputs as given (the GEMM's result rounded
        to bf16, each later op in the dtype its operands promote to), each output cast to
        its dtype: what a user runs without fusion, the eager / torch.compile baseline that
        eval and bench time. Not the tolerance reference (see `reference`)."""
        out = self._run_reference(inputs, dims, mm=torch.matmul)
        return {o.name: out[o.name].to(o.torch_dtype) for o in self.outputs}

    def make_inputs(self, dims: dict[str, int], seed: int, device: str | torch.device = "cpu") -> dict:
        """Fresh inputs (tensors and scalars) for one shape, reproducible from the seed; a task
        with `dtype = "precision"` tensors hands make_inputs `dtype=` (this Task's precision)."""
        gen = torch.Generator(device=device).manual_seed(seed)
        kw = {"dtype": DTYPES[self.precision]} if self.follows_precision else {}
        inputs = self._call("make_inputs", dims, gen, torch.device(device), **kw)
        for s in self.scalars:
            inputs[s.name] = s.value
        self._check_io(inputs, self.inputs, dims, "make_inputs")
        return inputs

    def reference(self, inputs: dict, dims: dict[str, int], exact: bool = True, mm=None,
                  rounded: bool = True) -> dict[str, torch.Tensor]:
        """The reference outputs. exact: every floating input cast to reference_dtype, the
        whole computation in it. Otherwise the low-precision reference that sets the
        tolerance (see Tolerance): what an honest fused kernel computes. The GEMM operands
        stay in their dtype and the GEMM accumulates in float32 (common.mm, or `mm`: the
        judge passes the fixed mainloop's own GEMM on a GPU, eval/numerics.references);
        every other floating input is cast to float32, so the epilogue and its reductions
        run in float32 on unrounded values; each output is rounded once, to its dtype
        (rounded=False: not yet, float32, so that partial sums over blocks of rows can be
        added before that one rounding)."""
        if exact:
            rdt = getattr(torch, self.reference_dtype)
            inputs = {k: v.to(rdt) if _floating(v) else v for k, v in inputs.items()}
            out = self._run_reference(inputs, dims, mm=common.mm, **({"store": common.keep} if self.gemms else {}))
        else:
            operands = self.gemm_operand_inputs
            inputs = {k: v.float() if _floating(v) and k not in operands else v for k, v in inputs.items()}
            kw = {"store": common.stored_as(DTYPES[self.precision])} if self.gemms else {}
            out = self._run_reference(inputs, dims, mm=mm or common.mm, **kw)
            out = {o.name: out[o.name].to(o.torch_dtype if rounded else torch.float32) for o in self.outputs}
        # a non-finite reference would pass any kernel there (every comparison with NaN is false);
        # the eager baseline (unfused) is not held to this: it is timed, not trusted
        for o in self.outputs:
            v = out[o.name]
            if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise TaskCodeError(self.folder / "reference.py", f"reference() gave non-finite values in {o.name}")
        return out

    def _check_io(self, values: dict, specs, dims, where) -> None:
        for spec in specs:
            t = values.get(spec.name)
            want = spec.concrete_shape(dims)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != spec.torch_dtype:
                got = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
                raise TaskCodeError(self.folder / "reference.py", f"{where} gave {spec.name}={got}, spec says {want} {spec.dtype}")

    # ---- roofline numbers -------------------------------------------------------------

    def _one_gemm(self, what: str) -> GemmDims:
        if self.gemm is None:
            raise TaskError(f"{self.name} runs {self.gemm_count} GEMMs: {what} takes a task of one "
                            "(gemm_shapes and gemm_operand_sets take any)")
        return self.gemm

    def gemm_shape(self, dims: dict[str, int]) -> tuple[int, int, int]:
        """(m, n, k) of a one-GEMM task's GEMM."""
        g = self._one_gemm("gemm_shape")
        return tuple(dimexpr.evaluate(e, dims) for e in (g.m, g.n, g.k))

    def gemm_shapes(self, dims: dict[str, int]) -> list[tuple[int, int, int]]:
        """(m, n, k) of every fused GEMM, in gemm_list's order."""
        return [tuple(dimexpr.evaluate(e, dims) for e in (g.m, g.n, g.k)) for _, g in self.gemm_list]

    def gemm_operands(self, inputs: dict):
        """(A, B) with B as (n, k): a one-GEMM task's GEMM-only baseline operands, in its layouts."""
        g = self._one_gemm("gemm_operands")
        b = inputs[g.b]
        return inputs[g.a], (b if g.b_layout == "nk" else b.T)

    def gemm_operand_sets(self, inputs: dict, dims: dict[str, int],
                          made: dict | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(A as (m, k), B as (n, k)) for every fused GEMM, views in the task's layouts: the
        GEMM-only baseline's operands. An operand that is no input (an intermediate the task
        makes on the way) is made here, N(0, 1) in the precision and in its layout, from a
        generator seeded by its name and shape, so that the plain GEMMs read what they
        would (the timing of a GEMM does not depend on the values beyond their scale); one
        tensor per name and shape, shared by the GEMMs that read it and, through `made`, by
        the calls that pass the same dict (the sets of inputs of one timed run)."""
        made = {} if made is None else made
        out = []
        for where, g in self.gemm_list:
            m, n, k = (dimexpr.evaluate(e, dims) for e in (g.m, g.n, g.k))
            pair = []
            for role, layout in (("a", g.a_layout), ("b", g.b_layout)):
                name = getattr(g, role)
                given = (m, k) if role == "a" else (n, k)
                stored = given if layout in ("mk", "nk") else given[::-1]
                t = inputs.get(name)
                if not isinstance(t, torch.Tensor):
                    t = made.get((name, stored))
                if not isinstance(t, torch.Tensor):
                    device = next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))
                    seed = int.from_bytes(hashlib.sha256(f"{name}:{stored}".encode()).digest()[:8], "little")
                    gen = torch.Generator(device=device).manual_seed(seed)
                    t = made[name, stored] = common.normal(stored, gen, device, dtype=DTYPES[self.precision])
                pair.append(t if layout in ("mk", "nk") else t.T)
            out.append((pair[0], pair[1]))
        return out

    def flops(self, dims: dict[str, int]) -> int:
        """2*m*n*k summed over the fused GEMMs (the epilogues' few flops per element are not
        counted)."""
        return sum(2 * m * n * k for m, n, k in self.gemm_shapes(dims))

    def min_bytes(self, dims: dict[str, int]) -> int:
        """Each input read once and each output written once."""
        total = 0
        for t in [*self.inputs, *self.outputs]:
            numel = 1
            for s in t.concrete_shape(dims):
                numel *= s
            total += numel * t.torch_dtype.itemsize
        return total

    def summary(self, shape_sets: dict[str, list["ShapeSet"]]) -> dict:
        """What `epiforge tasks list --json` prints for this task."""
        shapes = {
            set_name: [
                {"name": s.name, "dims": s.dims(),
                 "gemm_mnk": self.gemm_shape(s.dims()) if self.gemm is not None else None,
                 "gemms_mnk": self.gemm_shapes(s.dims()),
                 "flops": self.flops(s.dims()), "bytes": self.min_bytes(s.dims())}
                for s in sets
            ]
            for set_name, sets in shape_sets.items()
        }
        return {
            "id": self.id,
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "gemm": self.gemm.model_dump() if self.gemm is not None else None,
            "gemms": {where: g.model_dump() for where, g in self.gemm_list},
            "inputs": [t.model_dump() for t in self.inputs],
            "scalars": [s.model_dump() for s in self.scalars],
            "outputs": [o.model_dump() for o in self.outputs],
            "launches": self.launches,
            "tolerance": {o.name: o.tolerance.model_dump() for o in self.outputs},
            "reference_dtype": self.reference_dtype,
            "dtypes": self.dtypes,
            "shapes": shapes,
            "flops": {k: [s["flops"] for s in v] for k, v in shapes.items()},
            "bytes": {k: [s["bytes"] for s in v] for k, v in shapes.items()},
        }


# ---- loading ----------------------------------------------------------------------------


def _host_out_of_memory(e: BaseException) -> bool:
    """torch's CPU allocator failing (a RuntimeError, not torch.OutOfMemoryError): the
    machine's limit, never the task's fault."""
    return isinstance(e, RuntimeError) and any(
        m in str(e) for m in ("can't allocate memory", "not enough memory", "DefaultCPUAllocator"))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def _one_line(path: Path, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        parts.append(f"{loc}: {e['msg']}")
    return f"{path}: " + "; ".join(parts)


def _read_toml(path: Path) -> dict:
    """A TOML file's table; TaskError (one line naming the file) if it cannot be read or parsed."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text (TOML is): byte {e.start}") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read: {e.strerror}") from None


def load_task_file(path: Path) -> Task:
    """Parse and validate one task.toml; TaskError (one line, file and field) if malformed."""
    data = _read_toml(path)
    _import_finishing(path.parent)  # a task's own finishing steps, before `launches` names them
    try:
        task = Task(**data, folder=path.parent)
    except ValidationError as e:
        raise TaskError(_one_line(path, e)) from None
    except TypeError as e:
        raise TaskError(f"{path}: {e}") from None
    if task.name != path.parent.name:
        raise TaskError(f"{path}: name: {task.name!r} must match its folder {path.parent.name!r}")
    if not (path.parent / "reference.py").is_file():
        raise TaskError(f"{path.parent / 'reference.py'}: missing (a task needs make_inputs and reference there)")
    _check_sizes(task, path)
    _check_api(task, path.parent / "reference.py")
    return task


def _check_api(task: Task, file: Path) -> None:
    """A folder written to an older task API loads when its functions take what this one
    hands them; otherwise TaskError, one line saying what to change. Read from the source
    (ast), not imported: listing the catalogue runs no task code."""
    import ast

    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    except (OSError, SyntaxError, ValueError):
        return  # the judge reports it as the task's error when it imports the file
    params = {}  # function -> {parameter a caller may pass by keyword: has a default}, or None (**kwargs)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("reference", "make_inputs"):
            a = node.args
            if a.kwarg is not None:
                params[node.name] = None
                continue
            positional = [*a.posonlyargs, *a.args]
            defaulted = {x.arg for x in positional[len(positional) - len(a.defaults):]} if a.defaults else set()
            by_keyword = {x.arg: x.arg in defaulted for x in a.args}
            by_keyword |= {x.arg: d is not None for x, d in zip(a.kwonlyargs, a.kw_defaults)}
            params[node.name] = by_keyword
    old = task.api != TASK_API
    wrote = (f"written to task API {task.api or 1}" + ("" if task.api else " (it names no api)") + ":" if old
             else f"its functions do not take what task API {TASK_API} hands them:")
    then = f", and put api = {TASK_API} in task.toml" if old else ""
    where = "(tasks/AUTHORING.md, Versions)"
    ref, make = params.get("reference"), params.get("make_inputs")
    # the judge passes mm= and store= by keyword, and the timed eager and torch.compile baselines call
    # reference(inputs, dims) with neither: each needs a default
    if ref is not None and not ref.get("mm"):
        raise TaskError(f"{file}: {wrote} API {TASK_API} hands reference() the fused GEMM as the keyword mm, "
                        "and calls it without mm too: write reference(inputs, dims, mm=torch.matmul) and compute "
                        f"the GEMM as mm(a, b){then} {where}")
    if ref is not None and task.gemms and not ref.get("store"):
        raise TaskError(f"{file}: {wrote} a task of several GEMMs gets reference(inputs, dims, mm=, store=): add "
                        f"store=None and call store() on each tensor a GEMM writes and a later one reads{then} {where}")
    if make is not None and task.follows_precision and "dtype" not in make:
        raise TaskError(f"{file}: {wrote} make_inputs() gets the keyword dtype= for the \"precision\" tensors: write "
                        f"make_inputs(dims, gen, device, dtype=torch.bfloat16) and draw them in dtype{then} {where}")


def _import_finishing(folder: Path) -> None:
    """The task folder's optional finishing.py, which registers the task's own finishing
    steps (primitives.finish.register); TaskError (one line naming the file) if it raises."""
    file = folder / "finishing.py"
    if not file.is_file():
        return
    try:
        if folder.parent == TASKS_DIR:
            importlib.import_module(f"epiforge.tasks.{folder.name}.finishing")
        else:
            spec = importlib.util.spec_from_file_location(f"epiforge_tasks.{folder.name}.finishing", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except (MemoryError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the task's own code does is the task's fault
        raise TaskError(f"{file}: importing it raised {_first_line(e)}") from None


def _check_sizes(task: Task, path: Path) -> None:
    """Every dimension expression is a positive size at every shape of tasks/shapes.toml."""
    fields = [(f"{where}.{r}", getattr(g, r)) for where, g in task.gemm_list for r in ("m", "n", "k")]
    # the GPU's TMA moves 16-byte rows: a GEMM's N and K are multiples of 8 (a task of several
    # GEMMs reads some activations transposed, where K is a token count)
    rows8 = {f"{where}.{r}" for where, g in task.gemm_list for r in ("n", "k")} if task.gemms else set()
    for group in ("inputs", "outputs"):
        fields += [(f"{group}.{i}.shape", e) for i, t in enumerate(getattr(task, group)) for e in t.shape]
    for rows in load_shape_sets().values():
        for row in rows:
            for where, expr in fields:
                try:
                    size = dimexpr.evaluate(expr, row.dims())
                except ZeroDivisionError:
                    size = None
                if size is None or size <= 0:
                    raise TaskError(f"{path}: {where}: {expr!r} is {size} at shape {row.name}, not a positive size")
                if where in rows8 and size % 8:
                    raise TaskError(f"{path}: {where}: {expr!r} is {size} at shape {row.name}, not a multiple of 8 "
                                    "(the GPU's TMA moves 16-byte rows)")


def load_shape_sets(path: Path = TASKS_DIR / "shapes.toml") -> dict[str, list[ShapeSet]]:
    data = _read_toml(path)
    try:
        return {name: [ShapeSet(**row) for row in rows] for name, rows in data.items()}
    except ValidationError as e:
        raise TaskError(_one_line(path, e)) from None
