"""`@epilogue`: a plain function of the accumulator becomes a fused GEMM.

    @epilogue(outputs=("x",), operands={"w": PerCol()}, reductions={"sumsq": RowReduce(product=True)})
    def residual_rms(acc, c, w):
        x = acc + c
        return {"D": x * w, "x": x, "sumsq": (x, x)}

    out = residual_rms(a, w_o, c=residual, w=norm_weight)   # D = epilogue(a @ w_o^T)

The function is called per output element (per pair in the paired modes) and returns a
dict: "D" (the main output; omit it to store the raw accumulator), each declared output,
and each declared reduction's value (in acc_pair mode each pair output as pack(x, y)).
The call runs the quack SM90 GEMM when the tensors
are on a GPU and the tile emulator when they are on the CPU: one source, both places.
"""

from __future__ import annotations

import inspect
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from epiforge.primitives import graph, program, trace
from epiforge.primitives.config import ALSO_COMPILE_ENV, DEFAULT_CONFIG, GemmConfig
from epiforge.primitives.spec import (
    MODES,
    Operand,
    HeadRMS,
    PerCol,
    PerRow,
    Reduction,
    RowSelect,
    Scalar,
    Tile,
)

_HALF = (torch.bfloat16, torch.float16)
#: while torch.profiler runs, each fused GEMM call is a range named
#: "<PROFILE_LABEL> <m>x<n>x<k> <epilogue>", so that a profile can tell its kernels' GEMM
#: shape (lab/bench/training.py attributes GEMM time by shape)
PROFILE_LABEL = "epiforge.gemm"


class EpilogueError(ValueError):
    """A call or declaration that does not fit the epilogue contract (one clear line)."""


def _also_compile(config: GemmConfig) -> list[GemmConfig]:
    """The configs besides `config` that a cross-compile builds too (ALSO_COMPILE_ENV, set by
    `--tuned` from the kernel's TUNED table); a key that is no config is a compile error."""
    keys = [k for k in os.environ.get(ALSO_COMPILE_ENV, "").split(",") if k and k != config.key()]
    out = []
    for key in dict.fromkeys(keys):
        try:
            out.append(GemmConfig.parse(key))
        except ValueError as e:
            from epiforge.primitives.lowering import CompileError

            raise CompileError(f"the kernel's TUNED table names {key!r}: {e}") from None
    return out


@dataclass
class Epilogue:
    """An epilogue function plus its declarations. Build it with `@epilogue(...)` or
    `from_quack(...)`; call it like a function to run the fused GEMM."""

    fn: Callable
    outputs: tuple[str, ...] = ()
    operands: dict[str, Operand] = field(default_factory=dict)
    reductions: dict[str, Reduction] = field(default_factory=dict)
    mode: str = "element"
    # the function the emulator calls (a torch twin for quack's own epilogues)
    torch_fn: Callable | None = None
    # an existing quack EpiMod to launch on the GPU instead of minting one from `fn`
    quack_mod: object | None = None
    author: str | None = None
    # acc_pair only: extra outputs stored per pair at full width (M, N), returned as pack(x, y)
    pair_outputs: tuple[str, ...] = ()
    # the traced graph (primitives.graph) this epilogue's function replays, if it was rebuilt from one
    graph: object | None = None
    # a library epilogue named by P.from_quack("quack.<module>:<name>", operands): that name and those operands
    library_target: str | None = None
    library_operands: dict | None = None
    _replay: "Epilogue | None" = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.name = getattr(self.fn, "__name__", "epilogue")
        self.torch_fn = self.torch_fn or self.fn
        if self.mode not in MODES:
            raise EpilogueError(f"{self.name}: mode must be one of {MODES}, got {self.mode!r}")
        params = list(inspect.signature(self.fn).parameters)
        if not params or params[0] != "acc":
            raise EpilogueError(f"{self.name}: the function's first parameter must be 'acc'")
        self.params: tuple[str, ...] = tuple(params[1:])
        for p in self.params:
            if p != "c" and p not in self.operands:
                raise EpilogueError(
                    f"{self.name}: parameter {p!r} has no declaration; add operands={{{p!r}: "
                    "PerRow() | PerCol() | Scalar() | Tile() | HeadRMS(head_dim)}} (or name it 'c' for the GEMM's C)".replace("}}", "}")
                )
        for p in self.operands:
            if p not in self.params:
                raise EpilogueError(f"{self.name}: operand {p!r} is declared but not a parameter")
        reserved = {"config", "dtypes", "store_d"} & set(self.params)
        if reserved:
            raise EpilogueError(f"{self.name}: parameter names {sorted(reserved)} are reserved by the call")
        if self.pair_outputs and self.mode != "acc_pair":
            raise EpilogueError(f"{self.name}: pair_outputs= needs mode='acc_pair' (in element mode every output "
                                "is already full width: declare it in outputs=)")
        names = set(self.outputs) | set(self.pair_outputs) | set(self.reductions)
        clash = names & (set(self.params) | {"acc", "c", "D"})
        if clash or len(names) != len(self.outputs) + len(self.pair_outputs) + len(self.reductions):
            raise EpilogueError(f"{self.name}: output/reduction names clash: {sorted(clash)}")
        if self.mode == "packed_pair" and "c" not in self.params:
            raise EpilogueError(f"{self.name}: mode='packed_pair' needs the 'c' parameter")
        if sum(isinstance(k, HeadRMS) for k in self.operands.values()) > 1:
            raise EpilogueError(f"{self.name}: at most one HeadRMS() operand (one prepass statistic)")
        if self.mode == "acc_pair" and any(
            getattr(r, "product", False) for r in self.reductions.values()
        ):
            raise EpilogueError(
                f"{self.name}: product reductions are not available in acc_pair mode "
                "(quack 0.6.5): return the product itself as a pair"
            )
        self.index_names = tuple(
            r.index for r in self.reductions.values() if isinstance(r, RowSelect)
        )
        taken = set(self.params) | set(self.outputs) | set(self.pair_outputs) | set(self.reductions) | {"acc", "c", "D", "config", "dtypes", "store_d"}
        for idx in self.index_names:
            if idx in taken or not idx.isidentifier():
                raise EpilogueError(
                    f"{self.name}: RowSelect index {idx!r} must be a fresh keyword name "
                    "(not a parameter, output, reduction or call option)"
                )

    # ---- the call ----------------------------------------------------------------

    def __call__(
        self,
        a: torch.Tensor,
        w: torch.Tensor,
        /,
        c: torch.Tensor | None = None,
        *,
        config: GemmConfig | None = None,
        dtypes: Mapping[str, torch.dtype] | None = None,
        store_d: bool = True,
        **values,
    ) -> dict[str, torch.Tensor]:
        """Run D = epilogue(a @ w^T) with `a` (M, K) and `w` (N, K) (nn.Linear layout; a
        transposed view of a (K, N) tensor works too). Returns {"D": ..., <outputs>,
        <reductions as raw float32 partials>}; `store_d=False` skips writing D."""
        if program.describing():  # a kernel being described: one gemm step (primitives/program.py)
            return program.primitive_call("gemm", program.epilogue_name(self), self._gemm, (a, w),
                                          dict(c=c, config=config, dtypes=dtypes, store_d=store_d, **values))
        return self._gemm(a, w, c, config=config, dtypes=dtypes, store_d=store_d, **values)

    def _gemm(self, a, w, /, c=None, *, config=None, dtypes=None, store_d=True, **values) -> dict[str, torch.Tensor]:
        out = self._launch(a, w, c, config=config, dtypes=dtypes, store_d=store_d, **values)
        trace.made_partials(out[r] for r in self.reductions if isinstance(out.get(r), torch.Tensor))
        return out

    def _launch(self, a, w, /, c=None, *, config=None, dtypes=None, store_d=True, **values) -> dict[str, torch.Tensor]:
        call = self.check_call(a, w, c, values, dtypes, store_d)
        config = config or DEFAULT_CONFIG
        trace.record("gemm", f"{self.name}@{config.key()}")
        self._check_config(call, config)
        epi = self._replayed() if graph.replay_active() and not self.from_library and self.graph is None else self
        with self._profiled(call):
            described = program.describing()  # fake values on the judge's device: the emulator makes their shapes
            if a.device.type == "cuda" and not described:
                from epiforge.primitives.lowering import launch

                return launch(epi, call, config)
            if os.environ.get("EPIFORGE_CROSS_COMPILE") == "1" and not described:
                # the CPU compile check: build the exact GPU kernel for sm_90a (and the configs
                # --tuned names: the kernel's TUNED table), then emulate
                from epiforge.primitives.lowering import cross_compile

                extras = _also_compile(config)
                for extra in extras:  # each checked before anything is built: a misfit costs no compile
                    self._check_config(call, extra, why=f" (config {extra.key()}, from the kernel's TUNED table)")
                for built in (config, *extras):
                    cross_compile(epi, call, built)
            from epiforge.primitives.emulator import emulate

            if described:  # a Scalar given as a tensor has no value here; any number makes the same shapes
                # (1.0, not 0.0: a body may divide by it; a body that fails at 1.0 alone is a known limit)
                call.values = {p: 1.0 if isinstance(self.operands.get(p), Scalar) and isinstance(v, torch.Tensor) else v
                               for p, v in call.values.items()}
            return emulate(epi, call, config)

    def _check_config(self, call: "Call", config: GemmConfig, why: str = "") -> None:
        """What a config must fit in this epilogue and call, one line each (before any build)."""
        for p, kind in self.operands.items():
            if isinstance(kind, HeadRMS) and config.tile_n % kind.head_dim:
                raise EpilogueError(f"{self.name}(): {p} is HeadRMS(head_dim={kind.head_dim}): tile_n must be whole "
                                    f"heads, got {config.tile_n} (e.g. a 128x128 or 128x256 tile){why}")
        if self.mode == "acc_pair" and self.outputs and config.tile_n % 32:
            raise EpilogueError(f"{self.name}(): acc_pair outputs need tile_n a multiple of 32 on SM90, got "
                                f"{config.tile_n}{why}")
        if config.early_c_loads and call.c is None:
            raise EpilogueError(f"{self.name}(): config {config.key()} has early_c_loads, which moves C loads, but this "
                                f"call loads no C (pass c= or drop the flag){why}")
        if config.c_load_warp and call.c is None and not any(isinstance(k, Tile) for k in self.operands.values()):
            raise EpilogueError(f"{self.name}(): config {config.key()} has c_load_warp, which issues the epilogue's C "
                                f"loads, but this call loads no C and no tile (pass c= or drop the flag){why}")

    @property
    def from_library(self) -> bool:
        """A quack library epilogue (from_quack): quack's own EpiMod on the GPU, a torch twin
        in the emulator. (quack_mod alone does not tell: the GPU path mints one for every
        epilogue it launches.)"""
        return self.torch_fn is not self.fn

    def _replayed(self) -> "Epilogue":
        """This epilogue rebuilt from its traced graph, through the graph's JSON form (what
        would cross a process boundary); made once."""
        if self._replay is None:
            self._replay = graph.rebuild(graph.Graph.from_json(graph.trace(self).to_json()), self)
        return self._replay

    def _profiled(self, call: "Call"):
        """The call's profiler range (PROFILE_LABEL), only while a profiler runs."""
        if not torch.autograd._profiler_enabled():
            return nullcontext()
        return torch.profiler.record_function(f"{PROFILE_LABEL} {call.m}x{call.n}x{call.k} {self.name}")

    def check_call(self, a, w, c, values, dtypes, store_d) -> "Call":
        """Validate a call against the declarations; one clear error line when it does not fit."""
        where = f"{self.name}()"
        if not (isinstance(a, torch.Tensor) and a.ndim == 2 and a.dtype in _HALF):
            raise EpilogueError(f"{where}: a must be a 2-D bf16/fp16 tensor (M, K)")
        if not (isinstance(w, torch.Tensor) and w.ndim == 2 and w.dtype == a.dtype):
            raise EpilogueError(f"{where}: w must be a 2-D (N, K) tensor of a's dtype {a.dtype}")
        m, k = a.shape
        n = w.shape[0]
        if w.shape[1] != k:
            raise EpilogueError(f"{where}: a is (M={m}, K={k}) but w is {tuple(w.shape)}; expected (N, {k})")
        if n % 8 or k % 8:
            # TMA moves 16-byte rows: the GPU refuses such shapes at launch
            raise EpilogueError(f"{where}: N={n} and K={k} must be multiples of 8 (16-byte rows for the GPU's TMA)")
        if w.device != a.device:
            raise EpilogueError(f"{where}: a and w are on different devices")
        if self.mode == "acc_pair" and n % 2:
            raise EpilogueError(f"{where}: mode='acc_pair' needs an even N, got {n}")
        c_shape = (m, 2 * n) if self.mode == "packed_pair" else (m, n)
        if "c" in self.params:
            if c is None:
                raise EpilogueError(f"{where}: the function takes 'c' but no c was passed")
            if tuple(c.shape) != c_shape:
                raise EpilogueError(f"{where}: c must be {c_shape}, got {tuple(c.shape)}")
            if self.mode == "packed_pair" and c.dtype not in _HALF:
                raise EpilogueError(f"{where}: packed_pair c must be bf16/fp16, got {c.dtype}")
        elif c is not None:
            raise EpilogueError(f"{where}: c was passed but the function has no 'c' parameter")
        computed = {p for p, kind in self.operands.items() if isinstance(kind, HeadRMS)}
        for p in self.params:
            if p in computed and p in values:
                raise EpilogueError(f"{where}: {p}= is HeadRMS(), computed in the kernel; do not pass it")
            if p != "c" and p not in values and p not in computed:
                raise EpilogueError(f"{where}: missing operand {p}=")
        for p in computed:
            hd = self.operands[p].head_dim
            if n % hd:
                raise EpilogueError(f"{where}: {p}= is HeadRMS(head_dim={hd}); N={n} must be whole heads")
        for name in self.index_names:
            idx = values.get(name)
            if not isinstance(idx, torch.Tensor) or idx.shape != (m,) or idx.dtype not in (torch.int32, torch.int64):
                raise EpilogueError(f"{where}: {name}= must be an int32/int64 ({m},) tensor")
        unknown = set(values) - set(self.params) - set(self.index_names)
        if unknown:
            raise EpilogueError(f"{where}: unexpected arguments {sorted(unknown)}")
        for p, kind in self.operands.items():
            if p not in computed:
                _check_operand(where, p, kind, values[p], m, n, a.device)
        dtypes = dict(dtypes or {})
        unknown = set(dtypes) - {"D", *self.outputs, *self.pair_outputs}
        if unknown:
            raise EpilogueError(f"{where}: dtypes= names unknown outputs {sorted(unknown)}")
        d_default = c.dtype if self.mode == "packed_pair" else a.dtype
        dtypes.setdefault("D", d_default)
        if self.mode == "packed_pair" and store_d and dtypes["D"] != c.dtype:
            raise EpilogueError(f"{where}: packed_pair D has c's dtype {c.dtype}")
        for o in self.outputs:
            dtypes.setdefault(o, a.dtype)
            if self.mode == "acc_pair" and dtypes[o] not in _HALF:
                raise EpilogueError(f"{where}: acc_pair outputs are stored per pair in 16 bits; {o!r} cannot be {dtypes[o]}")
            if self.mode == "acc_pair" and (n // 2) % 8:
                raise EpilogueError(f"{where}: acc_pair output {o!r} is N/2 = {n // 2} wide; it must be a multiple of 8 (16-byte rows)")
        for o in self.pair_outputs:
            dtypes.setdefault(o, a.dtype)
            if dtypes[o] not in (*_HALF, torch.float32):
                raise EpilogueError(f"{where}: pair output {o!r} must be bf16, fp16 or float32, not {dtypes[o]}")
        return Call(a=a, w=w, c=c, values=values, dtypes=dtypes, store_d=store_d, m=m, n=n, k=k)


@dataclass
class Call:
    """A validated call: what both the emulator and the GPU lowering consume."""

    a: torch.Tensor
    w: torch.Tensor
    c: torch.Tensor | None
    values: dict
    dtypes: dict
    store_d: bool
    m: int
    n: int
    k: int


def _check_operand(where, name, kind, value, m, n, device) -> None:
    if isinstance(kind, Scalar):
        if isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
            return
        raise EpilogueError(f"{where}: {name}= is Scalar(); pass a number or a 1-element tensor")
    if not isinstance(value, torch.Tensor):
        raise EpilogueError(f"{where}: {name}= must be a tensor, got {type(value).__name__}")
    if value.device != device:
        raise EpilogueError(f"{where}: {name}= is on {value.device}, the GEMM on {device}")
    expected = {PerRow: (m,), PerCol: (n,), Tile: (m, n)}[type(kind)]
    if tuple(value.shape) != expected:
        raise EpilogueError(
            f"{where}: {name}= is {type(kind).__name__}() so its shape must be {expected}, "
            f"got {tuple(value.shape)}"
        )
    if not value.is_floating_point():
        raise EpilogueError(f"{where}: {name}= must be a floating-point tensor, got {value.dtype}")


def epilogue(
    outputs: tuple[str, ...] | list[str] = (),
    operands: Mapping[str, Operand] | None = None,
    reductions: Mapping[str, Reduction] | None = None,
    mode: str = "element",
    pair_outputs: tuple[str, ...] | list[str] = (),
):
    """Declare an epilogue. `outputs`: names of extra full tiles the function returns
    (stored like D; half width in acc_pair mode). `operands`: the kind of each parameter
    after `acc` (except `c`, the GEMM's C operand). `reductions`: per-row / per-column
    statistics the function returns. `mode`: "element" (one accumulator element per call),
    "acc_pair" (adjacent output columns 2j, 2j+1 arrive as one pair), "packed_pair" (C and
    D are 16-bit (M, 2N) tensors holding (x, y) pairs; the accumulator is one value per pair).
    `pair_outputs` (acc_pair only): extra outputs stored per pair at full width (M, N), like D;
    the function returns each as pack(x, y)."""

    def wrap(fn):
        return Epilogue(
            fn=fn,
            outputs=tuple(outputs),
            operands=dict(operands or {}),
            reductions=dict(reductions or {}),
            mode=mode,
            pair_outputs=tuple(pair_outputs),
        )

    return wrap
