"""The GPU meaning of `pair_outputs=`: acc_pair outputs stored per pair at full width.

quack 0.6.5's fn frontend stores every acc_pair output at half width (a gated TileStore:
one 16-bit value per pair) and refuses a full-width one ("output op ... must be gated in
acc_pair mode"). Its paired loop does collect full-width values for one kind of op, the
sinks: each returned pair lands in a fragment congruent with the accumulator's (D's
register layout). A `PairStore` is a sink and also quack's own full-width TileStore (the
element-mode store path); `PairStoreEpiMod` mints kernels whose visit hands each
PairStore's fragment to the store driver beside the other outputs, so it is rounded and
stored exactly as an element-mode output is. Imported by primitives/lowering.py only.
"""

from __future__ import annotations

import cutlass.cute as cute
from quack.epilogue.frontend import EpiMod
from quack.epilogue.ops import TileStore
from quack.epilogue.visit import _EpiModMixinBase


class PairStore(TileStore):
    """A full-width (M, N) output of an acc_pair epilogue, returned by the fn as pack(x, y)."""

    fn_port = "sink"

    def fn_sink_flush(self, gemm, state, frag):
        # state: the fragment the minted visit allocated for this subtile; the driver stores it
        state.store(frag.load())

    def sink_alloc_shape(self, lead, n, tile_m, tile_n, num_seqs=None):
        return (*lead, n)  # quack checks the buffer against this before the trace


class _PairStoreVisit:
    """Gives each PairStore a fresh accumulator-shaped fragment per subtile, runs quack's
    visit (whose sink flush fills it), and returns every tile store's fragment in the
    order of the driver's store contexts (the active TileStores, in op order)."""

    _epi_pair_stores: tuple[str, ...] = ()

    def epi_visit_subtile(self, params, epi_loop_tensors, tRS_rD, tRS_rC=None):
        frags = {n: cute.make_rmem_tensor(tRS_rD.layout.shape, self.acc_dtype) for n in self._epi_pair_stores}
        outs = _EpiModMixinBase.epi_visit_subtile(self, params, {**epi_loop_tensors, **frags}, tRS_rD, tRS_rC)
        frags.update(zip(self._epi_mod_outputs, outs))
        return tuple(frags[op.name] for op in self._epi_ops if op.is_tile_store())


class PairStoreEpiMod(EpiMod):
    """quack's EpiMod whose minted kernels store its PairStore sinks."""

    def _mint(self, *key):
        base = super()._mint(*key)
        minted = self.__dict__.setdefault("_pair_minted", {})
        if key not in minted:
            names = tuple(n for n, op in self.sinks.items() if isinstance(op, PairStore))
            minted[key] = type(f"{base.__name__}_pairs", (_PairStoreVisit, base), {
                "_epi_pair_stores": names, "EpilogueParams": base.EpilogueParams,
                "__module__": base.__module__, "__qualname__": f"{base.__qualname__}_pairs",
            })
        return minted[key]

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_pair_minted", None)  # process-local classes, re-minted where unpickled
        return state
