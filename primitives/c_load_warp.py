"""GemmConfig.c_load_warp: a warp of the producer warpgroup that does not load A/B issues
the epilogue's C (and TileLoad) sub-tile loads, ahead of the consumers and across tile
boundaries, so the C of the next tile is in flight during the current tile's mainloop
(primitive_docs/logs/quack-sm90-c-loads.md, sections 3 and 8).

quack 0.6.5's SM90 kernel issues C only from the consumer's TMA warp, inside its
epilogue and within the current tile; its SM100 kernel has a dedicated C-load warp
(gemm_sm100.py, `epi_load_warp_id`). This ports that warp to SM90 with asserted text
edits (primitives/quack_patch.py), installed on a subclass only when the flag is set:

  GemmSm90.kernel               warp ab_load_warp_id + 1 (idle at 40 registers) runs
                                `c_load_warp`; the A/B warp opens it (named barrier
                                EpilogueLoad) once tile 0's A/B loads are issued; the
                                epilogue gets copy_C=None (it only waits and releases)
  GemmSm90.make_sched_pipeline  one more consumer warp per CTA of the tile scheduler

The C-load warp walks the scheduler's tiles exactly as the A/B warp does (including the
extra record pingpong's tail reads) and produces one stream of C pipeline positions in
tile order: tile j of the CTA's sequence holds positions j*E .. j*E+E-1, which is the
stream quack's consumers already read (in pingpong each warpgroup skips the peer's E).
Split-K, varlen and gather_A are refused. Any difference from the quack text these
edits expect raises CLoadWarpError.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Boolean, const_expr

from epiforge.primitives import quack_patch


# ---- the edits: (expected text, replacement), each expected exactly once -------------------

_KERNEL_CONTEXT = (
    # the consumers read one C stream in tile order: the pingpong peer skips c_tile_cnt
    "epi_producer_state.advance_iters(c_tile_cnt)",
    "c_tile_cnt = cute.size(self.epi_tile_shape)",
    # the A/B warp reads one extra (invalid) work tile at pingpong's tail: so does the C-load warp
    "if const_expr(self.pingpong and not varlen_k and self.split_k == 1):",
    # the epilogue's C copy fns (which the C-load warp builds the same way, per tile)
    "copy_C = copy_utils.tma_producer_copy_fn(copy_C_fn, epi_pipeline)",
)
_KERNEL_EDITS = (
    (   # the A/B warp's "tile 0 issued" flag
        """\
            ag_last_gate = Int32(-1)  # 1-entry satisfied-gate cache (see ag_wait_m_tile)
""",
        """\
            ag_last_gate = Int32(-1)  # 1-entry satisfied-gate cache (see ag_wait_m_tile)
            c_load_gate = Boolean(True)  # epiforge (primitives/c_load_warp.py)
""",
    ),
    (   # ... which opens the C-load warp once tile 0's A/B loads are all issued
        """\
                iket.range_pop()
                tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)
""",
        """\
                iket.range_pop()
                # epiforge (primitives/c_load_warp.py): tile 0's A/B are issued, C may start
                if c_load_gate:
                    self.epiforge_c_load_barrier().arrive()
                    c_load_gate = Boolean(False)
                tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)
""",
    ),
    (   # the C-load warp: the producer warpgroup's first warp after the A/B warp(s)
        """\
            if is_scheduler_warp:
                tile_scheduler.producer_tail()

    if warp_idx < self.ab_load_warp_id:
""",
        """\
            if is_scheduler_warp:
                tile_scheduler.producer_tail()
        # epiforge (primitives/c_load_warp.py): the C-load warp
        if warp_idx == self.ab_load_warp_id + self.num_ab_load_warps:
            self.epiforge_run_c_load_warp(
                epi_pipeline, tma_atom_c, mC_mnl, sC, epilogue_params, epi_smem_tensors,
                varlen_manager, TileSchedulerCls, varlen_m or varlen_k,
            )

    if warp_idx < self.ab_load_warp_id:
""",
    ),
    (   # the epilogue only waits for C and releases it
        """\
                copy_C=copy_C,
""",
        """\
                copy_C=None,  # epiforge (primitives/c_load_warp.py): the C-load warp loads C
""",
    ),
)
_SCHED_EDITS = (
    (
        """\
    ) * 4 + self.num_ab_load_warps
""",
        """\
    ) * 4 + self.num_ab_load_warps + 1  # epiforge (primitives/c_load_warp.py): + the C-load warp
""",
    ),
)
_EPILOGUE_CONTEXT = (
    # with copy_C=None the epilogue issues no C load but still waits and releases every sub-tile
    "inline_epi_load = const_expr(copy_C is not None)",
    """\
                iket.range_push("epi_c_wait")
                epi_pipeline.consumer_wait(epi_read_state)
""",
)


_METHODS: dict[str, object] = {}
_CLASSES: dict[type, type] = {}


class CLoadWarpError(quack_patch.QuackPatchError):
    """quack's source is not the text this module edits, or the kernel cannot take the flag."""


_fail = functools.partial(quack_patch.mismatch, CLoadWarpError, "c_load_warp", "primitives/c_load_warp.py")  # _fail(what)


def _edited(fn, what: str, context, edits) -> str:
    return quack_patch.edited(fn, context, edits, lambda: _fail(what))


def _methods() -> dict[str, object]:
    if not _METHODS:
        import quack.gemm_base as gemm_base
        import quack.gemm_sm90 as gemm_sm90

        def load(src, name, module):
            return quack_patch.materialize(src, name, module, "primitives/c_load_warp.py", lambda: CLoadWarpError(
                "c_load_warp: no writable cache dir for the edited quack sources"))

        _edited(gemm_base.GemmBase.epilogue, "GemmBase.epilogue", _EPILOGUE_CONTEXT, ())
        kernel = _edited(gemm_sm90.GemmSm90.kernel, "GemmSm90.kernel", _KERNEL_CONTEXT, _KERNEL_EDITS)
        sched = _edited(gemm_sm90.GemmSm90.make_sched_pipeline, "GemmSm90.make_sched_pipeline", (), _SCHED_EDITS)
        _METHODS.update(kernel=load(kernel, "kernel", gemm_sm90),
                        make_sched_pipeline=load(sched, "make_sched_pipeline", gemm_sm90),
                        epiforge_run_c_load_warp=c_load_warp, epiforge_c_load_barrier=staticmethod(c_load_barrier))
    return _METHODS


def c_load_class(cls: type) -> type:
    """cls with the C-load warp (one subclass per class, made once)."""
    from quack.gemm_sm90 import GemmSm90

    return quack_patch.subclass(cls, GemmSm90, ("kernel", "make_sched_pipeline"), "c_load_warp", _methods(),
                                _CLASSES, lambda why: CLoadWarpError(f"c_load_warp: {why}"))


def install(gemm) -> None:
    """Make a GEMM object (before its trace) build the C-load-warp kernel."""
    gemm.__class__ = c_load_class(type(gemm))


def check(gemm) -> None:
    """After quack sized the stages: refuse what the C-load warp does not support."""
    if gemm.split_k != 1:
        raise CLoadWarpError("c_load_warp: split-K tiles skip their C loads; the flag does not support split_k > 1")
    if gemm.gather_A or gemm.num_ab_load_warps != 1:
        raise CLoadWarpError("c_load_warp: gather_A uses the whole producer warpgroup for A/B; not supported")
    if gemm.epi_c_stage == 0:
        raise CLoadWarpError("c_load_warp: this GEMM loads no C and no tile in its epilogue")


def c_load_barrier():
    """The named barrier by which the A/B warp lets the C-load warp start (quack's own
    EpilogueLoad id, unused by its SM90 kernel): one arrive, one arrive_and_wait."""
    from quack.gemm_base import NamedBarrierGemm

    return pipeline.NamedBarrier(barrier_id=int(NamedBarrierGemm.EpilogueLoad), num_threads=2 * cute.arch.WARP_SIZE)


@cute.jit
def c_load_warp(self, epi_pipeline, tma_atom_c, mC_mnl, sC, epilogue_params, epi_smem_tensors, varlen_manager,
                TileSchedulerCls: cutlass.Constexpr, varlen: cutlass.Constexpr):
    """The C-load warp's loop: every tile of the scheduler's sequence, its E sub-tiles in the
    epilogue's order, one C pipeline position each (acquire, TMA, commit), then the pingpong
    tail's extra work tile and the pipeline's producer tail."""
    from cutlass.experimental import primitives as prims
    import quack.copy_utils as copy_utils
    from quack.pipeline import make_pipeline_state

    if const_expr(varlen):
        raise CLoadWarpError("c_load_warp: varlen tiles have a dynamic C count; not supported")
    if const_expr(epi_pipeline is None):
        raise CLoadWarpError("c_load_warp: this GEMM loads no C and no tile in its epilogue")
    if const_expr(self.use_pdl):
        # C may be the previous kernel's output: wait for it, as the A/B warp does
        prims.griddepcontrol(prims.GridDepAction.WAIT)
    epi_tile_layout, epi_tile_num = quack_patch.subtile_order(self)
    producer_state = make_pipeline_state(pipeline.PipelineUserType.Producer, self.epi_c_stage)
    gate = Boolean(True)
    tile_scheduler = TileSchedulerCls()
    work_tile = tile_scheduler.initial_work_tile_info()
    while work_tile.is_valid_tile:
        tile_coord_mnkl = work_tile.tile_idx
        copy_C = None
        if const_expr(mC_mnl is not None):
            copy_C_fn, _, _ = self.epilog_gmem_copy_and_partition(
                tma_atom_c, varlen_manager.offset_batch_epi(mC_mnl, tile_coord_mnkl[3]),
                self.cta_tile_shape_mnk[:2], self.epi_tile, sC, tile_coord_mnkl)
            copy_C = copy_utils.tma_producer_copy_fn(copy_C_fn, epi_pipeline)
        tile_load_copy_fns = self.epi_tile_load_g2s_copy_fns(
            epilogue_params, epi_smem_tensors, tile_coord_mnkl, varlen_manager, epi_pipeline)
        copy_epi_load = copy_utils.chain_tma_producer_copy_fns((copy_C, *tile_load_copy_fns))
        if gate:
            c_load_barrier().arrive_and_wait()
            gate = Boolean(False)
        for epi_idx in cutlass.range(epi_tile_num, unroll=1):
            epi_pipeline.producer_acquire(producer_state)
            copy_epi_load(src_idx=epi_tile_layout.get_hier_coord(epi_idx), producer_state=producer_state)
            epi_pipeline.producer_commit(producer_state)
            producer_state.advance()
        tile_scheduler.advance_to_next_work()
        work_tile = tile_scheduler.get_current_work()
    if const_expr(self.pingpong):
        # the A/B warp publishes and reads one more (invalid) work tile for the warpgroup
        # that skips the last one; every scheduler consumer, this warp too, must release it
        work_tile = tile_scheduler.get_current_work()
    epi_pipeline.producer_tail(producer_state)
