"""What the primitives did during one call: an explicit seam for the evaluator.

Every fused GEMM (an epilogue call), finishing step and prepare helper records itself
while a `recording()` block is active, and the GPU lowering tells a compile listener when
it starts and ends building a kernel. The evaluator's kernel runner uses both: on a CPU
the record is the launch check (the task's fused GEMMs plus its named finishing steps, as
the GPU profiler counts them), and the compile marks tell a compiler crash apart from a
kernel's own. Nothing here is part of the kernel-facing API.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

_record: list[str] | None = None
_compile_listener = None


def record(kind: str, name: str) -> None:
    """Note one primitive call ("gemm", "finish" or "prepare") while a recording runs."""
    if _record is not None:
        _record.append(f"{kind}:{name}")


@contextmanager
def recording():
    """Collect the primitive calls made inside the block (a list, filled as they happen)."""
    global _record
    outer, _record = _record, []
    try:
        yield _record
    finally:
        _record = outer


def set_compile_listener(listener) -> None:
    """listener(building: bool) is called when a kernel build starts (True) and ends (False)."""
    global _compile_listener
    _compile_listener = listener


@contextmanager
def building():
    """Marks a kernel build for the listener (the lowering wraps compiles in it)."""
    if _compile_listener is not None:
        _compile_listener(True)
    try:
        yield
    finally:
        if _compile_listener is not None:
            _compile_listener(False)


#: the reduction partials this process's fused GEMMs returned, by id (alive ones only)
_partials: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def made_partials(tensors) -> None:
    """Note the buffers a fused GEMM's reductions wrote: the only tensors a fold (a finishing
    step that takes partials) accepts."""
    for t in tensors:
        _partials[id(t)] = t


def is_partials(t) -> bool:
    """Whether `t` itself (not a view or copy of it) is a buffer a fused GEMM's reduction wrote."""
    return _partials.get(id(t)) is t
