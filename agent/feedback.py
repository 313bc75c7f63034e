"""What the model is told about an evaluation, and what a log may keep of it.

Feedback is plain text: the outcome, the worst numeric mismatch per output, the sm_90a
compile log (which epilogue, which tile config, ok or the error), the traceback tail of a
failure, and on a GPU the time against GEMM-only and the other baselines (eval.result
ShapeTiming). Paths of this
machine are scrubbed from everything that reaches the model or a log.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from epiforge.eval.kernel import REPO

_STDERR_CHARS = 1500
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")  # colour and cursor codes (CSI and two-byte escapes)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # other control characters; tab and newline stay
# what the CuTe DSL suggests to its own users (decorate with @jit, mark loops dynamic): an
# epilogue is traced by the harness, so such a hint can only mislead the model
_DSL_ONLY_HINT = re.compile(r"@(?:cute\.)?jit|@cute\.kernel|dynamic_expr|range_dynamic|preprocess")


def plain(text: str) -> str:
    """Text as the model should get it: no terminal escape codes, no control characters, and
    none of the CuTe DSL's suggestions that apply only to hand-written DSL code."""
    return _drop_dsl_hints(_CONTROL.sub("", _ANSI.sub("", text or "")))


def _drop_dsl_hints(text: str) -> str:
    """Remove each `suggestion:` of a DSL diagnostic (with its wrapped continuation lines)
    that names the DSL's own decorators. Pieces are lines, or the " | "-joined lines that
    primitives/lowering.py makes of the compiler's last lines."""
    parts = re.split(r"(\n| \| )", text)
    pieces, seps = parts[0::2], parts[1::2]
    keep, i = [], 0
    while i < len(pieces):
        if pieces[i].strip().startswith("suggestion:"):
            j = i + 1
            while j < len(pieces) and pieces[j].startswith(" " * 8) and not re.match(r"\s*\w+:", pieces[j]):
                j += 1
            if _DSL_ONLY_HINT.search(" ".join(pieces[i:j])):
                i = j
                continue
        keep.append(i)
        i += 1
    if not keep:
        return ""
    out = pieces[keep[0]]
    for k in keep[1:]:
        out += seps[k - 1] + pieces[k]
    return out


def scrub(text: str, *extra_roots: Path) -> str:
    """Replace this machine's paths (the repo, workspaces, the venv, home) with neutral names."""
    if not text:
        return text
    prefixes = sorted({sys.prefix, os.path.realpath(sys.prefix)}, key=len, reverse=True)
    for p in prefixes:
        text = text.replace(p, "<venv>")
    for root, name in [*[(r, ".") for r in extra_roots], (REPO, "<repo>"), (Path.home(), "~")]:
        for form in {str(root), os.path.realpath(root)}:
            if form and form != "/":
                text = text.replace(form, name)
    return text


def scrub_tree(value, *extra_roots: Path):
    """scrub() every string in a JSON-able value."""
    if isinstance(value, str):
        return scrub(value, *extra_roots)
    if isinstance(value, list):
        return [scrub_tree(v, *extra_roots) for v in value]
    if isinstance(value, dict):
        return {k: scrub_tree(v, *extra_roots) for k, v in value.items()}
    return value


# ---- timing -------------------------------------------------------------------------------


def speed_ratio(result) -> float | None:
    """The worst kernel / GEMM-only ratio over the timed shapes (the evaluator's
    per-repetition median); None when nothing was timed."""
    ratios = [s.timing.fused_over_gemm_only.median for s in result.per_shape if s.timing]
    return max(ratios) if ratios else None


# ---- the text -----------------------------------------------------------------------------


def describe(result, *, what: str, workspace: Path | None = None) -> str:
    """Feedback for the model on one evaluation. It never names the seed (the inputs and
    the hidden shapes derive from it) nor a hidden shape's dims."""
    roots = (workspace,) if workspace else ()
    if result.stage == "static":
        where = "static checks of the source; nothing ran"
    else:
        where = f"{'GPU' if result.device == 'cuda' else 'CPU emulator'}, {result.shapes} shapes + a hidden one"
    took = f"; {result.wall_s:.1f} s" if result.wall_s else ""
    lines = [f"{what}: {result.outcome.value} ({where}{took})", scrub(result.message, *roots)]
    if result.provisional:
        lines.append("(provisional: correct on the CPU emulator; only a Hopper GPU run makes it final)")
    several = len({shape.dtype for shape in result.per_shape}) > 1  # each line names its precision then
    for shape in result.per_shape:
        name = f"{shape.shape} ({shape.dtype})" if several else shape.shape
        for check in shape.outputs:
            if check.ok:
                err = f"max error {check.max_error:.3e} <= allowed {check.allowed:.3e}" if check.max_error is not None else "ok"
                lines.append(f"  {name} {check.name}: ok ({err})")
            elif check.detail and check.detail in result.message:  # the message above says it already
                lines.append(f"  {name} {check.name}: FAILED {check.problem} (the mismatch above)")
            else:
                lines.append(f"  {name} {check.name}: FAILED {check.problem}: {scrub(check.detail, *roots)}")
        if shape.outcome.value != "PASSED" and not shape.outputs and shape.message and shape.message not in result.message:
            lines.append(f"  {name}: {scrub(shape.message, *roots)}")
        if shape.launches:  # GPU launch provenance: the kernels one run() launched
            lines.append(f"  {name} launches: {', '.join(n[:80] for n in shape.launches)}")
        if shape.timing:
            lines.append(f"  {name} timing: {_timing_line(shape.timing)}")
    if result.compiled:
        lines.append("sm_90a cross-compile (launch provenance):")
        seen = set()
        for c in result.compiled:
            key = (c.get("epilogue"), c.get("config"), c.get("ok"))
            if key in seen:  # the same build again for the next shape (a cache hit)
                continue
            seen.add(key)
            error = str(c.get("error", ""))
            status = ("ok" if c.get("ok") else "FAILED (the error above)" if error and error in result.message
                      else f"FAILED: {scrub(error, *roots)}")
            lines.append(f"  {c.get('epilogue')} [{c.get('config')}]{' mode=' + c['mode'] if c.get('mode') else ''}: {status} ({c.get('seconds', 0)} s)")
    if not result.passed and result.stderr_tail:
        tail = scrub(result.stderr_tail, *roots).strip()[-_STDERR_CHARS:]
        lines.append("stderr (tail):\n" + tail)
    return plain("\n".join(line for line in lines if line))


def _timing_line(timing) -> str:
    over = timing.fused_over_gemm_only
    ci = f", 95% interval {over.ci_low:.3f}-{over.ci_high:.3f}" if over.ci_low is not None else ""
    parts = [f"kernel {timing.kernel.median_us:.1f} us",
             f"{over.median:.3f}x GEMM-only (quartiles {over.q1:.3f}-{over.q3:.3f}{ci})"]
    parts += [f"{name} {t.median_us:.1f} us ({timing.speedup[name].median:.2f}x slower than the kernel)"
              if name in timing.speedup else f"{name} {t.median_us:.1f} us" for name, t in timing.baselines.items()]
    return ", ".join(parts)
