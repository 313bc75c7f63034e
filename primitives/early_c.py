"""GemmConfig.early_c_loads: in pingpong, a tile's first C loads are issued before the
wait for the other warpgroup's epilogue instead of after it (see
primitive_docs/logs/quack-sm90-c-loads.md, section 6).

quack 0.6.5 issues a tile's first min(E, S) C sub-tile loads (E sub-tiles per tile, S C
stages) inside its epilogue (gemm_base.py, GemmBase.epilogue), which the pingpong kernel
enters only after the `epi` named barrier (gemm_sm90.py, GemmSm90.kernel), i.e. after the
other warpgroup's whole epilogue. Here the kernel issues those loads just before the
barrier and the epilogue skips them. The kernel body has no method boundary at that
point, so two of quack's methods get a small, asserted textual edit:

  GemmSm90.kernel     the `epi` barrier moves below the (side-effect-free) construction of
                      the tile's C copy fns, with a call to `early_c_loads` before it
  GemmBase.epilogue   its prologue loads are dropped (the barrier after them is kept)

The edited sources are written to a file under the cache dir (CuTe-DSL's preprocessor
reads a function's source from its file), executed in quack's own module namespace, and
installed on a subclass of the kernel's class only when the flag is set (`install`, from
primitives/lowering.py's _setup_attributes hook, when quack's post_init set the flag). Any
difference from the text these edits expect raises EarlyCError: a quack upgrade cannot
silently miscompile.

Why it is exact: the C pipeline is one stream of slots in tile order shared by the two
warpgroups, so the early producer_acquire of position p waits for the peer's release of
position p - S (its own previous tile's C). An mbarrier parity wait is exact only if the
waiter is at most one phase ahead, i.e. if position p - 2S is already released. Nothing
orders the peer's epilogue against this warpgroup's mainloop, so that holds for the first
early load only if p - 2S lies in a tile this warpgroup already ordered itself after (its
own previous tile or older): 2S > E. Each later early load then needs a release the
previous (exact) wait already proved. So the flag needs S > E/2 (5 of 8 sub-tiles on a
128x128 pingpong tile) and refuses smaller S at trace time.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass import const_expr

from epiforge.primitives import quack_patch


# ---- the edits: (expected text, replacement), each expected exactly once -------------------

_KERNEL_CONTEXT = (
    # one C slot stream in tile order: each warpgroup skips the peer's c_tile_cnt positions
    "epi_producer_state.advance_iters(c_tile_cnt)",
    "c_tile_cnt = cute.size(self.epi_tile_shape)",
    'self.pingpong_barrier_arrive(1 - warp_group_idx, stage="epi")',
)
_KERNEL_EDITS = (
    (
        """\
            # EPILOGUE
            if const_expr(self.pingpong):
                self.pingpong_barrier_sync(warp_group_idx, "epi")
            iket.range_push("epilogue")
""",
        """\
            # EPILOGUE
            iket.range_push("epilogue")
""",
    ),
    (
        """\
                copy_C = copy_utils.chain_tma_producer_copy_fns((copy_C, *tile_load_copy_fns))

""",
        """\
                copy_C = copy_utils.chain_tma_producer_copy_fns((copy_C, *tile_load_copy_fns))
            # epiforge (primitives/early_c.py): this tile's first C loads, then the epi barrier
            epi_producer_state = self.epiforge_issue_early_c(
                epi_pipeline, epi_producer_state, copy_C, is_tma_warp, varlen_k
            )
            if const_expr(self.pingpong):
                self.pingpong_barrier_sync(warp_group_idx, "epi")

""",
    ),
)
_EPILOGUE_CONTEXT = (
    # the sub-tile order early_c_loads reproduces
    """\
    epi_tile_shape = cute.zipped_divide(
        cute.make_layout(self.cta_tile_shape_mnk[:2]), epi_tile
    ).shape[1]
    epi_tile_layout = cute.make_ordered_layout(
        epi_tile_shape, order=(0, 1) if const_expr(self.epi_m_major) else (1, 0)
    )
    epi_tile_num = cute.size(epi_tile_shape)
""",
    # refills continue the stream at sub-tile epi_idx + epi_c_stage, within the tile
    """\
        if const_expr(inline_epi_load and epi_idx + self.epi_c_stage < epi_tile_num):
            epi_coord_C = epi_tile_layout.get_hier_coord(epi_idx + self.epi_c_stage)
""",
)
_EPILOGUE_EDITS = (
    (
        """\
    if const_expr(inline_epi_load):
        for epi_idx in cutlass.range(min(epi_tile_num, self.epi_c_stage), unroll=1):
            epi_coord_C = epi_tile_layout.get_hier_coord(epi_idx)
            if const_expr(use_tma_c):
                if is_tma_warp:
                    epi_pipeline.producer_acquire(epi_producer_state)
                    copy_C(src_idx=epi_coord_C, producer_state=epi_producer_state)
                    epi_pipeline.producer_commit(epi_producer_state)
                epi_producer_state.advance()
            else:
                # TODO: turn this to cp.async instead of direct G2R copy
                copy_C(src_idx=epi_coord_C, dst_idx=epi_idx % self.epi_c_stage)
        if const_expr(use_tma_c):
            epilogue_barrier.arrive_and_wait()
""",
        """\
    if const_expr(inline_epi_load):
        # epiforge (primitives/early_c.py): the kernel issued this tile's first
        # min(epi_tile_num, epi_c_stage) C loads before the pingpong epi barrier
        if const_expr(use_tma_c):
            epilogue_barrier.arrive_and_wait()
""",
    ),
)


class EarlyCError(quack_patch.QuackPatchError):
    """quack's source is not the text this module edits, or the kernel cannot take the flag."""


_fail = functools.partial(quack_patch.mismatch, EarlyCError, "early_c_loads", "primitives/early_c.py")  # _fail(what)


def _edited(fn, what: str, context, edits) -> str:
    return quack_patch.edited(fn, context, edits, lambda: _fail(what))


_METHODS: dict[str, object] = {}
_CLASSES: dict[type, type] = {}


def _methods() -> dict[str, object]:
    if not _METHODS:
        import quack.gemm_base as gemm_base
        import quack.gemm_sm90 as gemm_sm90

        kernel = _edited(gemm_sm90.GemmSm90.kernel, "GemmSm90.kernel", _KERNEL_CONTEXT, _KERNEL_EDITS)
        epilogue = _edited(gemm_base.GemmBase.epilogue, "GemmBase.epilogue", _EPILOGUE_CONTEXT, _EPILOGUE_EDITS)
        _METHODS.update(kernel=_materialize(kernel, "kernel", gemm_sm90),
                        epilogue=_materialize(epilogue, "epilogue", gemm_base),
                        epiforge_issue_early_c=early_c_loads)
    return _METHODS


def _materialize(src: str, name: str, module):
    return quack_patch.materialize(src, name, module, "primitives/early_c.py", lambda: EarlyCError(
        "early_c_loads: no writable cache dir for the edited quack sources"))


def early_class(cls: type) -> type:
    """cls with the edited kernel and epilogue (one subclass per class, made once)."""
    from quack.gemm_sm90 import GemmSm90

    return quack_patch.subclass(cls, GemmSm90, ("kernel", "epilogue"), "early_c", _methods(), _CLASSES,
                                lambda why: EarlyCError(f"early_c_loads: {why}"))


def install(gemm) -> None:
    """Make a GEMM object (before its trace) build the early-C-loads kernel."""
    gemm.__class__ = early_class(type(gemm))


def check(gemm) -> None:
    """After quack sized the stages: refuse what the early loads cannot do exactly."""
    tiles = cute.size(gemm.epi_tile_shape)
    if not gemm.pingpong:
        raise EarlyCError("early_c_loads needs pingpong=True (cooperative kernels have no epi barrier to move past)")
    if gemm.split_k != 1:
        raise EarlyCError("early_c_loads: split-K tiles skip their C loads; the flag does not support split_k > 1")
    if gemm.epi_c_stage == 0:
        raise EarlyCError("early_c_loads: this GEMM loads no C")
    if 2 * gemm.epi_c_stage <= tiles:
        raise EarlyCError(
            f"early_c_loads needs more than half of a tile's {tiles} epilogue sub-tiles in C stages, got "
            f"{gemm.epi_c_stage} (an earlier wait could pass on a stale mbarrier phase): set epi_c_stages >= "
            f"{tiles // 2 + 1}")


@cute.jit
def early_c_loads(self, epi_pipeline, epi_producer_state, copy_C, is_tma_warp, varlen_k: cutlass.Constexpr):
    """The epilogue's prologue C loads of this tile, issued by its TMA warp before the
    pingpong epi barrier: sub-tiles 0 .. min(E, S) - 1 in the epilogue's order, at the
    next positions of the warpgroup's C producer state (returned advanced)."""
    if const_expr(varlen_k):
        raise EarlyCError("early_c_loads: varlen_k tiles have a dynamic C count; not supported")
    if const_expr(copy_C is None or epi_pipeline is None):
        raise EarlyCError("early_c_loads: this GEMM loads no C by TMA")
    epi_tile_layout, epi_tile_num = quack_patch.subtile_order(self)
    for epi_idx in cutlass.range_constexpr(min(epi_tile_num, self.epi_c_stage)):
        if is_tma_warp:
            epi_pipeline.producer_acquire(epi_producer_state)
            copy_C(src_idx=epi_tile_layout.get_hier_coord(epi_idx), producer_state=epi_producer_state)
            epi_pipeline.producer_commit(epi_producer_state)
        epi_producer_state.advance()
    return epi_producer_state
