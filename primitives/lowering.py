"""The GPU meaning of an epilogue: quack 0.6.5's SM90 GEMM with the function as its
epilogue (the seam between the contract and quack; keep it thin).

`launch` runs a validated call on CUDA tensors. `compile_only` builds the same kernel
for sm_90a on a machine without a GPU (CUTE_DSL_ARCH=sm_90a, QUACK_ARCH=90): it is the
CI's compile check and the way to fill quack's object cache before a GPU session.
Importing quack happens here, on first use, never on the emulator path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from epiforge.primitives import trace
from epiforge.primitives.config import GemmConfig
from epiforge.primitives.epilogue import Call, Epilogue
from epiforge.primitives.spec import (
    ColReduce, HeadRMS, PerCol, PerRow, RowLogSumExp, RowReduce, RowSelect, Scalar, Tile, partials_shape,
)

#: the H200/H100 SM count; stands in for the driver's cluster-occupancy query when compiling without a GPU
SM90_SM_COUNT = 132
_REPO_SOURCES = [Path(__file__).resolve().parent]
_QUACK_MODE = {"element": None, "acc_pair": "acc_pair", "packed_pair": "packed_cd_b16x2"}
_COMBINE = {"sum": "add", "max": "max", "absmax": "max_abs"}
_quack_ready = False
#: the attribute a config's epi_c_stages travels in (quack's post_init_attrs: set on the
#: GEMM object before tracing, and part of both the in-memory and the on-disk compile key)
_C_STAGES_ATTR = "epiforge_epi_c_stage_base"
#: the attribute a config's early_c_loads travels in, the same way (primitives/early_c.py)
_EARLY_C_ATTR = "epiforge_early_c_loads"
#: the attribute a config's c_load_warp travels in, the same way (primitives/c_load_warp.py)
_C_LOAD_ATTR = "epiforge_c_load_warp"
#: the attribute a config's epi_tile_n travels in, the same way
_EPI_TILE_ATTR = "epiforge_epi_tile_n"
#: the stage counts of the kernels this process traced: "class tile [pp] [csN] [enN] [ec] [cl]" -> (A/B, D, C)
STAGES: dict[str, tuple[int, int, int]] = {}


def _import_quack():
    """Import quack once, registering our sources in its compile-cache fingerprint so an
    edited primitive never reuses a stale compiled kernel."""
    global _quack_ready
    import quack.cache as qcache

    if not _quack_ready:
        for src in _REPO_SOURCES:
            if src not in qcache.EXTRA_SOURCE_DIRS:
                qcache.EXTRA_SOURCE_DIRS.append(src)
        _hook_stage_split()
        _quack_ready = True
    from quack.epilogue import frontend, ops

    return frontend, ops


def _hook_stage_split():
    """quack sizes the epilogue's C stages from a class attribute (GemmSm90.epi_c_stage_base,
    4) and gives the mainloop what shared memory is left. A config's epi_c_stages overrides
    it for one trace: on the kernel's own (minted, per-epilogue) class, restored after.
    A config's epi_tile_n overrides the epilogue sub-tile's width the same way, through the
    class's _compute_tile_shape_or_override (quack's own override hook, which no frontend
    argument reaches). A config's early_c_loads gives the object, before its trace, a
    subclass with the edited kernel (primitives/early_c.py), then checks the stage split
    allows it; c_load_warp likewise (primitives/c_load_warp.py)."""
    from quack.gemm_sm90 import GemmSm90

    original = GemmSm90._setup_attributes
    if getattr(original, "_epiforge", False):
        return

    def _setup_attributes(self, *args, **kwargs):
        base = getattr(self, _C_STAGES_ATTR, None)
        early = bool(getattr(self, _EARLY_C_ATTR, False))
        if early:
            from epiforge.primitives import early_c

            early_c.install(self)
        c_load = bool(getattr(self, _C_LOAD_ATTR, False))
        if c_load:
            from epiforge.primitives import c_load_warp

            c_load_warp.install(self)
        cls = type(self)
        epi_n = getattr(self, _EPI_TILE_ATTR, None)
        overrides = {}
        if base is not None:
            overrides["epi_c_stage_base"] = base
        if epi_n is not None:
            overrides["_compute_tile_shape_or_override"] = _epi_tile_width(cls, epi_n)
        saved = {k: cls.__dict__[k] for k in overrides if k in cls.__dict__}
        for k, v in overrides.items():
            setattr(cls, k, v)
        try:
            original(self, *args, **kwargs)
        finally:  # for this trace only: the class is the epilogue's, shared by every config
            for k in overrides:
                if k in saved:
                    setattr(cls, k, saved[k])
                else:
                    delattr(cls, k)
        tile = "x".join(str(x) for x in self.cta_tile_shape_mnk[:2])
        name = (f"{cls.__name__} {tile}{' pp' if self.pingpong else ''}{f' cs{base}' if base else ''}"
                f"{f' en{epi_n}' if epi_n else ''}{' ec' if early else ''}{' cl' if c_load else ''}")
        STAGES[name] = (self.ab_stage, self.epi_stage, self.epi_c_stage)
        if early:
            early_c.check(self)
        if c_load:
            c_load_warp.check(self)

    _setup_attributes._epiforge = True
    GemmSm90._setup_attributes = _setup_attributes


def _epi_tile_width(cls, width: int):
    """cls's epilogue-tile rule with the sub-tile's columns set to width (its rows as quack
    picks them: the accumulator's layout fixes those)."""
    import inspect

    rule = inspect.getattr_static(cls, "_compute_tile_shape_or_override")  # GemmSm90's is static, the mixin's not
    static = isinstance(rule, staticmethod)

    def _compute_tile_shape_or_override(self, cta_tile_shape_mnk, atom_layout_mnk, element_type=None,
                                        epi_tile_override=None):
        args = (cta_tile_shape_mnk, atom_layout_mnk, element_type, epi_tile_override)
        rows, _ = rule.__func__(*args) if static else rule(self, *args)
        return (rows, width)

    return _compute_tile_shape_or_override


def quack_mod(epi: Epilogue):
    """The quack EpiMod for an epilogue (its own for library epilogues; minted once
    otherwise, every operand pinned to its declared kind)."""
    if epi.quack_mod is not None:
        return epi.quack_mod
    frontend, ops = _import_quack()
    from quack.epilogue.head_rmsnorm import HeadRstd

    pin = {PerRow: ops.ColVecLoad, PerCol: ops.RowVecLoad, Scalar: ops.Scalar, Tile: ops.TileLoad,
           HeadRMS: lambda p, kind: HeadRstd(p, eps=float(kind.eps))}
    pins = {p: pin[type(kind)](p, kind) if isinstance(kind, HeadRMS) else pin[type(kind)](p)
            for p, kind in epi.operands.items()}
    head = [p for p, kind in epi.operands.items() if isinstance(kind, HeadRMS)]
    prepass = {"prepass": _squares_prepass(head[0]), "prepass_outs": (head[0],)} if head else {}
    sinks, extra = {}, []
    for name, red in epi.reductions.items():
        if isinstance(red, RowReduce):
            sinks[name] = ops.ColVecReduce(name, combine=_COMBINE[red.combine], scaled=red.product)
        elif isinstance(red, ColReduce):
            sinks[name] = ops.RowVecReduce(name, combine=_COMBINE[red.combine], scaled=red.product)
        elif isinstance(red, RowLogSumExp):
            sinks[name] = ops.OnlineLSEReduce(name)
        elif isinstance(red, RowSelect):
            idx = ops.ColVecLoad(red.index)
            extra.append(idx)
            sinks[name] = ops.ColVecSelect(name, idx_op=idx)
    declared = dict(outputs=epi.outputs, ops=pins, outs=sinks, mode=_QUACK_MODE[epi.mode], extra_ops=tuple(extra), **prepass)
    if epi.pair_outputs:  # full-width acc_pair outputs: quack's frontend has none (primitives/pair_store.py)
        from epiforge.primitives.pair_store import PairStore, PairStoreEpiMod

        sinks.update((name, PairStore(name)) for name in epi.pair_outputs)
        epi.quack_mod = PairStoreEpiMod(epi.fn, **declared)
    else:
        epi.quack_mod = frontend.gemm_epilogue(**declared)(epi.fn)
    return epi.quack_mod


def _squares_prepass(name: str):
    """The prepass a HeadRMS operand needs: the accumulator's squares under its name, which
    quack's HeadRstd folds per (row, head) before the epilogue proper runs."""
    def squares(acc):
        return {name: acc * acc}

    squares.__qualname__ = f"squares_prepass[{name}]"  # part of quack's compile key
    return squares


def _buffers(epi: Epilogue, call: Call, config: GemmConfig, device):
    """D, outputs and reduction buffers, plus quack's epi_args for the call."""
    m, n = call.m, call.n
    d = None
    if call.store_d:
        width = 2 * n if epi.mode == "packed_pair" else n
        d = torch.empty((m, width), dtype=call.dtypes["D"], device=device)
    out_w = n // 2 if epi.mode == "acc_pair" else n
    result = {"D": d} if d is not None else {}
    epi_args = {}
    for o in epi.outputs:
        result[o] = epi_args[o] = torch.empty((m, out_w), dtype=call.dtypes[o], device=device)
    for o in epi.pair_outputs:
        result[o] = epi_args[o] = torch.empty((m, n), dtype=call.dtypes[o], device=device)
    for name, red in epi.reductions.items():
        # no fill: a select's out-of-range rows stay unwritten (garbage, where the emulator
        # shows NaN) because a fill would be one more launch than the task allows
        shape = partials_shape(red, m, n, config.tile_m, config.tile_n)
        result[name] = epi_args[name] = torch.empty(shape, dtype=torch.float32, device=device)
    for p, kind in epi.operands.items():
        if isinstance(kind, HeadRMS):
            epi_args[p] = kind.head_dim  # HeadRstd's host argument: the group width
            continue
        v = call.values[p]
        if isinstance(kind, Scalar):
            epi_args[p] = float(v) if not isinstance(v, torch.Tensor) else float(v.reshape(()).item())
        elif isinstance(kind, (PerRow, PerCol)):
            epi_args[p] = v.reshape(1, -1)  # quack's vectors carry a batch dim
        else:
            epi_args[p] = v
    for idx in epi.index_names:
        epi_args[idx] = call.values[idx].reshape(1, -1)
    return d, result, epi_args


def _gemm(epi: Epilogue, call: Call, config: GemmConfig, launch: bool, device):
    mod = quack_mod(epi)
    d, result, epi_args = _buffers(epi, call, config, device)
    mod.gemm(
        call.a,
        call.w,
        d,
        call.c,
        epi_args=epi_args,
        tile_M=config.tile_m,
        tile_N=config.tile_n,
        cluster_M=config.cluster_m,
        cluster_N=config.cluster_n,
        pingpong=config.pingpong,
        persistent=True,
        max_swizzle_size=config.max_swizzle_size,
        post_init_attrs=(((_C_STAGES_ATTR, config.epi_c_stages),) if config.epi_c_stages is not None else ())
        + (((_EARLY_C_ATTR, True),) if config.early_c_loads else ())
        + (((_C_LOAD_ATTR, True),) if config.c_load_warp else ())
        + (((_EPI_TILE_ATTR, config.epi_tile_n),) if config.epi_tile_n is not None else ()),
        _launch=launch,
    )
    return result


#: (epilogue, config, mode, operand dtypes and majors) this process has launched: the first
#: launch of each compiles (an operand read transposed is another kernel)
_LAUNCHED: set[tuple] = set()


def launch(epi: Epilogue, call: Call, config: GemmConfig) -> dict[str, torch.Tensor]:
    """Run the fused GEMM on the GPU; returns D, outputs and raw reduction partials. The
    first launch of an epilogue and config JIT-compiles it (marked for trace's listener)."""
    key = (epi.name, config.key(), epi.mode, call.a.dtype, call.a.stride(-1) == 1, call.w.stride(-1) == 1,
           None if call.c is None else call.c.stride(-1) == 1)
    if key in _LAUNCHED:
        return _gemm(epi, call, config, True, call.a.device)
    with trace.building():
        out = _gemm(epi, call, config, True, call.a.device)
    _LAUNCHED.add(key)
    return out


def compile_only(epi: Epilogue, call: Call, config: GemmConfig) -> None:
    """Compile the kernel for sm_90a without a GPU (CPU tensors only describe shapes and
    dtypes; nothing runs). Needs CUTE_DSL_ARCH=sm_90a and QUACK_ARCH=90 set before
    quack is imported; raises whatever the DSL compiler raises."""
    if os.environ.get("QUACK_ARCH") != "90" or os.environ.get("CUTE_DSL_ARCH") != "sm_90a":
        raise RuntimeError("compile_only needs QUACK_ARCH=90 and CUTE_DSL_ARCH=sm_90a in the environment")
    _import_quack()
    import quack.gemm_runtime.host as host

    # the launch-time occupancy query needs a driver; every SM of an H100/H200 runs one
    # CTA of these kernels, so a persistent grid has SMs // cluster_size clusters
    host.get_max_active_clusters = lambda cluster_size, *a, **k: SM90_SM_COUNT // cluster_size
    _gemm(epi, call, config, False, torch.device("cpu"))


class CompileError(RuntimeError):
    """The DSL compiler rejected an epilogue: names the epilogue, the config and the message."""


#: what this process cross-compiled: {epilogue, config, ok, seconds[, error]} per attempt
COMPILE_LOG: list[dict] = []


def cross_compile(epi: Epilogue, call: Call, config: GemmConfig) -> None:
    """compile_only with a record in COMPILE_LOG; a failure raises CompileError carrying
    the compiler's own message (its last lines, where the DSL puts the cause)."""
    entry = {"epilogue": epi.name, "config": config.key(), "mode": epi.mode}
    t0 = time.monotonic()
    try:
        with trace.building():
            compile_only(epi, call, config)
    except Exception as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        msg = " | ".join(lines[-6:]) if lines else type(e).__name__
        entry.update(ok=False, seconds=round(time.monotonic() - t0, 2), error=f"{type(e).__name__}: {msg}")
        COMPILE_LOG.append(entry)
        raise CompileError(f"epilogue {epi.name} [{config.key()}] does not compile for sm_90a: {type(e).__name__}: {msg}") from e
    entry.update(ok=True, seconds=round(time.monotonic() - t0, 2))
    COMPILE_LOG.append(entry)


