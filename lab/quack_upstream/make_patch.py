"""Write the C-load warp as a patch that could be offered to quack (issue 16, section 3): an
opt-in flag `c_load_warp` on quack's GemmSm90, a unified diff against the INSTALLED
quack-kernels package, its GPU test and its description.

    python -m lab.quack_upstream.make_patch --out DIR

writes DIR/c-load-warp.patch (apply from the folder that holds `quack/`, i.e. quack's
repository root or site-packages: `patch -p1 < c-load-warp.patch` or `git apply`),
DIR/test_gemm_sm90_c_load_warp.py (for quack's tests/) and DIR/DESCRIPTION.md.

The diff is generated, never committed: it carries quack's own lines. What this module
holds of quack is only the short expected-text anchors of each edit. The edits are the
ones primitives/c_load_warp.py makes on a subclass (measured on the H200 there), written
as quack would carry them: every change sits behind `const_expr(self.c_load_warp)`, a
class attribute that defaults to False, so the flag-off kernel is the program quack
builds today. The flag is set per GEMM object before its trace, through the epilogue
frontend's `post_init_attrs=(("c_load_warp", True),)` (which also keys quack's compile
caches), or `gemm.c_load_warp = True` on a GemmSm90 built by hand.

Each edit is (expected text, replacement) and its expected text must occur exactly once
in the installed file, or the generator stops with one line naming the edit: a quack
other than 0.6.5 fails loudly instead of yielding a patch that does not apply.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the quack-kernels release the expected texts are written against
WRITTEN_AGAINST = "0.6.5"
TEST_TEMPLATE = HERE / "template_test_gemm_sm90_c_load_warp.py"
DESCRIPTION_TEMPLATE = HERE / "template_DESCRIPTION.md"
PATCH_NAME = "c-load-warp.patch"
TEST_NAME = "test_gemm_sm90_c_load_warp.py"
DESCRIPTION_NAME = "DESCRIPTION.md"


class PatchError(RuntimeError):
    """The installed quack is not the text the edits expect (or is not installed)."""


@dataclass(frozen=True)
class Edit:
    path: str  #: the file, relative to the folder that holds the `quack` package
    what: str  #: a few words naming the edit in the one-line failure
    expected: str  #: quack's text, which must occur exactly once
    replacement: str  #: what replaces it (the expected text kept, lines added around it)


_SM90 = "quack/gemm_sm90.py"

#: the new methods of GemmSm90: the refusals, the gate and the C-load warp's loop (our code)
_METHODS = '''\
    def _check_c_load_warp(self):
        """c_load_warp's refusals, once the stages are sized: one line each."""
        why = None
        if self.arch != 90:
            why = f"only GemmSm90's own SM90 kernel has the C-load warp (arch {self.arch})"
        elif self.split_k != 1:
            why = "split_k > 1 is not supported (only the finalizing split would load C)"
        elif self.gather_A:
            why = "gather_A takes every producer warp for A; not supported"
        elif self.varlen_m or self.varlen_k:
            why = "varlen_m / varlen_k are not supported (their per-tile C count is dynamic)"
        elif self.epi_c_stage == 0:
            why = "this GEMM loads no C and no epilogue tile; there is nothing to load"
        if why is not None:
            raise ValueError(f"c_load_warp: {why}")

    def c_load_warp_barrier(self) -> pipeline.NamedBarrier:
        """c_load_warp: the named barrier by which the A/B-load warp lets the C-load warp
        start once tile 0's A/B loads are issued, so C does not compete with them (the
        EpilogueLoad id, as on SM100; SM90 has no other user of it)."""
        return pipeline.NamedBarrier(
            barrier_id=int(NamedBarrierGemm.EpilogueLoad),
            num_threads=(self.num_ab_load_warps + 1) * cute.arch.WARP_SIZE,
        )

    @cute.jit
    def c_load_warp_loop(
        self,
        epi_pipeline: cutlass.pipeline.PipelineAsync,
        tma_atom_c: Optional[cute.CopyAtom],
        mC_mnl: Optional[cute.Tensor],
        sC: Optional[cute.Tensor],
        epilogue_params,
        epi_smem_tensors,
        varlen_manager: VarlenManager,
        TileSchedulerCls: cutlass.Constexpr[Callable],
    ):
        """c_load_warp: the C-load warp walks the CTA's work tiles as the A/B-load warp does
        and issues every C (and epilogue tile-load) sub-tile into the epi pipeline, in the
        order the epilogue consumes them. Tile j of the CTA's sequence takes pipeline
        positions j*E .. j*E+E-1 (E sub-tiles a tile): the stream the epilogue warps already
        read (in pingpong each warpgroup skips its peer's E). So the next tiles' C is in
        flight during the current tile's mainloop; the epilogue only waits and releases."""
        if const_expr(self.use_pdl):
            # C may be the previous kernel's output: wait for it as the A/B-load warp does
            prims.griddepcontrol(prims.GridDepAction.WAIT)
        epi_tile_shape = cute.zipped_divide(
            cute.make_layout(self.cta_tile_shape_mnk[:2]), self.epi_tile
        ).shape[1]
        epi_tile_num = cute.size(epi_tile_shape)
        # sub-tile coordinates in the order GemmBase.epilogue consumes them
        epi_tile_order = cute.make_ordered_layout(
            epi_tile_shape, order=(0, 1) if const_expr(self.epi_m_major) else (1, 0)
        )
        epi_producer_state = make_pipeline_state(
            pipeline.PipelineUserType.Producer, self.epi_c_stage
        )
        first_tile = Boolean(True)
        tile_scheduler = TileSchedulerCls()
        work_tile = tile_scheduler.initial_work_tile_info()
        while work_tile.is_valid_tile:
            tile_coord_mnkl = work_tile.tile_idx
            copy_C = None
            if const_expr(mC_mnl is not None):
                copy_C_fn, _, _ = self.epilog_gmem_copy_and_partition(
                    tma_atom_c,
                    varlen_manager.offset_batch_epi(mC_mnl, tile_coord_mnkl[3]),
                    self.cta_tile_shape_mnk[:2],
                    self.epi_tile,
                    sC,
                    tile_coord_mnkl,
                )
                copy_C = copy_utils.tma_producer_copy_fn(copy_C_fn, epi_pipeline)
            tile_load_copy_fns = self.epi_tile_load_g2s_copy_fns(
                epilogue_params, epi_smem_tensors, tile_coord_mnkl, varlen_manager, epi_pipeline
            )
            copy_epi_load = copy_utils.chain_tma_producer_copy_fns((copy_C, *tile_load_copy_fns))
            if first_tile:
                self.c_load_warp_barrier().arrive_and_wait()
                first_tile = Boolean(False)
            for epi_idx in cutlass.range(epi_tile_num, unroll=1):
                epi_pipeline.producer_acquire(epi_producer_state)
                copy_epi_load(
                    src_idx=epi_tile_order.get_hier_coord(epi_idx),
                    producer_state=epi_producer_state,
                )
                epi_pipeline.producer_commit(epi_producer_state)
                epi_producer_state.advance()
            tile_scheduler.advance_to_next_work()
            work_tile = tile_scheduler.get_current_work()
        if const_expr(self.pingpong):
            # The A/B-load warp publishes and reads one more (invalid) work tile for the
            # warpgroup that skips the last one: as a scheduler consumer, read it too.
            work_tile = tile_scheduler.get_current_work()
        epi_pipeline.producer_tail(epi_producer_state)

'''

EDITS: tuple[Edit, ...] = (
    Edit(_SM90, "the flag, a class attribute beside epi_c_stage_base",
         "    epi_c_stage_base = 4\n",
         "    epi_c_stage_base = 4\n"
         "    # Opt-in C-load warp: a producer warp that SM90 leaves idle issues every C (and\n"
         "    # epilogue tile-load) TMA load, ahead of the epilogue and across tile boundaries,\n"
         "    # as GemmSm100's epi-load warp does. Read at trace time only (const_expr): False\n"
         "    # builds the kernel as before. Set it on the GEMM object before the trace, e.g.\n"
         "    # through the epilogue frontend's post_init_attrs=((\"c_load_warp\", True),).\n"
         "    c_load_warp = False\n"),
    Edit(_SM90, "the refusals, where _setup_attributes has sized the stages",
         "        self.sched_stage = 2 if self.pingpong else 1\n",
         "        self.sched_stage = 2 if self.pingpong else 1\n"
         "        if const_expr(self.c_load_warp):\n"
         "            self._check_c_load_warp()\n"),
    Edit(_SM90, "the A/B-load warp's gate flag",
         "                ag_last_gate = Int32(-1)  # 1-entry satisfied-gate cache (see ag_wait_m_tile)\n",
         "                ag_last_gate = Int32(-1)  # 1-entry satisfied-gate cache (see ag_wait_m_tile)\n"
         "                if const_expr(self.c_load_warp):\n"
         "                    c_load_warp_waits = Boolean(True)\n"),
    Edit(_SM90, "the A/B-load warp opens the gate after tile 0's loads",
         "                    iket.range_pop()\n"
         "                    tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)\n",
         "                    iket.range_pop()\n"
         "                    if const_expr(self.c_load_warp):\n"
         "                        if c_load_warp_waits:\n"
         "                            # tile 0's A/B loads are issued: the C-load warp may start\n"
         "                            self.c_load_warp_barrier().arrive()\n"
         "                            c_load_warp_waits = Boolean(False)\n"
         "                    tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)\n"),
    Edit(_SM90, "the C-load warp's branch after the A/B-load warp's",
         "                if is_scheduler_warp:\n"
         "                    tile_scheduler.producer_tail()\n"
         "\n"
         "        if warp_idx < self.ab_load_warp_id:\n",
         "                if is_scheduler_warp:\n"
         "                    tile_scheduler.producer_tail()\n"
         "            if const_expr(self.c_load_warp):\n"
         "                # the producer warpgroup's first warp after the A/B-load warp(s)\n"
         "                if warp_idx == self.ab_load_warp_id + self.num_ab_load_warps:\n"
         "                    self.c_load_warp_loop(\n"
         "                        epi_pipeline,\n"
         "                        tma_atom_c,\n"
         "                        mC_mnl,\n"
         "                        sC,\n"
         "                        epilogue_params,\n"
         "                        epi_smem_tensors,\n"
         "                        varlen_manager,\n"
         "                        TileSchedulerCls,\n"
         "                    )\n"
         "\n"
         "        if warp_idx < self.ab_load_warp_id:\n"),
    Edit(_SM90, "the epilogue builds no C copy under the flag",
         "                if const_expr(has_C):\n"
         "                    copy_C_fn, _, _ = self.epilog_gmem_copy_and_partition(\n",
         "                # c_load_warp: the C-load warp issues C; the epilogue only waits and releases\n"
         "                if const_expr(has_C and not self.c_load_warp):\n"
         "                    copy_C_fn, _, _ = self.epilog_gmem_copy_and_partition(\n"),
    Edit(_SM90, "the epilogue builds no tile-load copy under the flag",
         "                if const_expr(has_epi_load):\n"
         "                    tile_load_copy_fns = self.epi_tile_load_g2s_copy_fns(\n",
         "                if const_expr(has_epi_load and not self.c_load_warp):\n"
         "                    tile_load_copy_fns = self.epi_tile_load_g2s_copy_fns(\n"),
    Edit(_SM90, "the C-load warp consumes the scheduler's work tiles",
         "        ) * 4 + self.num_ab_load_warps\n",
         "        ) * 4 + self.num_ab_load_warps\n"
         "        if const_expr(self.c_load_warp):\n"
         "            sched_consumer_warps_per_cta += 1  # the C-load warp reads every work tile too\n"),
    Edit(_SM90, "the new methods, before canonical_a_load",
         "    def canonical_a_load(self, tiled_mma, sA, tidx, tCrA):\n",
         _METHODS + "    def canonical_a_load(self, tiled_mma, sA, tidx, tCrA):\n"),
)


def quack_root() -> Path:
    """The folder that holds the installed `quack` package (found without importing it)."""
    spec = importlib.util.find_spec("quack")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("make_patch: quack-kernels is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0]).parent


def quack_version() -> str:
    try:
        return importlib.metadata.version("quack-kernels")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def edited(root: Path | None = None) -> dict[str, tuple[str, str]]:
    """{path: (quack's text, the edited text)} for every file the edits touch; raises
    PatchError in one line if an expected text does not occur exactly once."""
    where = f"quack-kernels {quack_version()}'s" if root is None else f"{root}'s"
    root = quack_root() if root is None else root
    texts: dict[str, tuple[str, str]] = {}
    for i, edit in enumerate(EDITS, 1):
        if edit.path not in texts:
            try:
                original = (root / edit.path).read_text()
            except OSError as e:
                raise PatchError(f"make_patch: cannot read {edit.path} under {root}: {e.strerror}") from None
            if "c_load_warp" in original:
                raise PatchError(f"make_patch: {where} {edit.path} already has a c_load_warp; patch an unpatched quack")
            texts[edit.path] = (original, original)
        original, text = texts[edit.path]
        found = text.count(edit.expected)
        if found != 1:
            raise PatchError(
                f"make_patch: {where} {edit.path} is not the text edit {i} ({edit.what}) expects: "
                f"found {found} times, not once; the edits are written against quack-kernels {WRITTEN_AGAINST}")
        texts[edit.path] = (original, text.replace(edit.expected, edit.replacement))
    return texts


def unified_diff(texts: dict[str, tuple[str, str]]) -> str:
    """A `patch -p1` / `git apply` diff, paths relative to the folder that holds `quack/`."""
    out = []
    for path, (old, new) in texts.items():
        lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     fromfile=f"a/{path}", tofile=f"b/{path}", n=3)
        out.append(f"diff --git a/{path} b/{path}\n")
        for line in lines:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diffstat(texts: dict[str, tuple[str, str]]) -> str:
    rows = []
    for path, (old, new) in texts.items():
        added = removed = 0
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), n=0, lineterm=""):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        rows.append(f"{path}: +{added} -{removed} lines")
    return "; ".join(rows)


def description(texts: dict[str, tuple[str, str]], source: str) -> str:
    """The template with what the patch was generated against (source) and its size."""
    text = DESCRIPTION_TEMPLATE.read_text()
    for marker, value in (("{{quack_source}}", source), ("{{diffstat}}", diffstat(texts))):
        assert marker in text, f"{DESCRIPTION_TEMPLATE.name} lost its {marker}"
        text = text.replace(marker, value)
    return text


_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(diff: str, root: Path) -> list[str]:
    """Apply a diff that unified_diff() wrote to the files under root, as `patch -p1 -F0`
    would but stricter: every hunk exactly where its header puts it, no offset, no fuzz.
    Returns the paths it patched; raises PatchError (one line) on the first mismatch."""
    files: list[tuple[str, list[tuple[int, list[str], list[str]]]]] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path = lines[i + 1][4:].rstrip("\n").split("\t")[0]
            files.append((path.split("/", 1)[1], []))  # -p1
            i += 2
            continue
        hunk = _HUNK.match(line)
        if hunk is None:
            i += 1  # "diff --git" and other header lines
            continue
        if not files:
            raise PatchError(f"apply_patch: a hunk before any file header, line {i + 1}")
        left = [int(hunk[2]) if hunk[2] is not None else 1, int(hunk[4]) if hunk[4] is not None else 1]
        old: list[str] = []
        new: list[str] = []
        i += 1
        while left[0] > 0 or left[1] > 0:
            if i < len(lines) and lines[i] == "\n":
                lines[i] = " \n"  # an empty context line whose space an editor stripped
            if i >= len(lines) or lines[i][:1] not in (" ", "-", "+"):
                raise PatchError(f"apply_patch: hunk {hunk[0]} of {files[-1][0]} ends early, line {i + 1}")
            tag, text = lines[i][0], lines[i][1:]
            if i + 1 < len(lines) and lines[i + 1].startswith("\\"):
                text = text.rstrip("\n")  # the line before "\ No newline at end of file"
                i += 1
            if tag in " -":
                old.append(text)
                left[0] -= 1
            if tag in " +":
                new.append(text)
                left[1] -= 1
            i += 1
        files[-1][1].append((int(hunk[1]), old, new))
    results: dict[Path, str] = {}
    for path, hunks in files:
        target = root / path
        text = target.read_text().splitlines(keepends=True)
        out: list[str] = []
        pos = 0
        for start, old, new in hunks:
            at = start - 1 if old else start
            if at < pos or text[at:at + len(old)] != old:
                raise PatchError(f"apply_patch: the hunk at line {start} of {path} does not match {target}")
            out += text[pos:at] + new
            pos = at + len(old)
        results[target] = "".join(out + text[pos:])
    for target, text in results.items():  # nothing is written unless every hunk matched
        target.write_text(text)
    return [path for path, _ in files]


def write(out: Path, root: Path | None = None) -> dict[str, Path]:
    """Write the patch, the test and the description into out; returns their paths."""
    texts = edited(root)
    source = f"quack-kernels {quack_version()}" if root is None else f"the quack tree at {root}"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"patch": out / PATCH_NAME, "test": out / TEST_NAME, "description": out / DESCRIPTION_NAME}
    paths["patch"].write_text(unified_diff(texts))
    paths["test"].write_text(TEST_TEMPLATE.read_text())
    paths["description"].write_text(description(texts, source))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the folder to write the three files into")
    ap.add_argument("--quack-root", type=Path, default=None,
                    help="the folder that holds quack/ (a quack checkout); default: the installed package's")
    args = ap.parse_args(argv)
    try:
        paths = write(args.out, args.quack_root)
    except PatchError as e:
        print(e, file=sys.stderr)
        return 1
    for path in paths.values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
