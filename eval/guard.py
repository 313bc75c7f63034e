"""Run-time guards around a candidate's calls inside the worker (behind the static rules).

ComputeGuard (the CPU's launch check). On a GPU the torch profiler shows every kernel a
call launches; on a CPU nothing launches, so the guard watches torch instead: a
TorchFunctionMode sees every torch function and Tensor method called while run() runs.
A call is the primitives' own work when a frame of primitives/ is on the stack (the
emulator, the finishing steps, an epilogue body the emulator calls); otherwise the
kernel's own code called torch, and only metadata, views and empty allocations are
allowed: anything else (tensor arithmetic, a matmul, a copy, a fill) would be one more
kernel launch on the GPU, and is reported as EXTRA_LAUNCHES.

Poison (the outputs poisoned before each run). Kernels return fresh tensors, so the
"output buffer" is whatever the allocator hands out inside run(); a kernel that leaves
elements unwritten, or hopes torch.empty returns the reference's freed result, reads
stale memory. While a checked call runs, torch's deterministic mode fills every
uninitialized allocation (torch.empty & co., the primitives' and quack's output buffers
included) with NaN (integers: their maximum), so any element the kernel did not write
fails the NaN check. Timed runs are not poisoned (the fill is a launch); their outputs
are re-checked after timing instead (eval/gpu_stages.py).

Tamper: a snapshot of the callables of torch, the timers, the profiler and the checker
taken before the kernel is imported; a kernel that patched any of them is rejected.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

PRIMITIVES_DIR = str(Path(__file__).resolve().parent.parent / "primitives") + "/"
_TORCH_DIR = str(Path(torch.__file__).resolve().parent) + "/"
_HERE = str(Path(__file__).resolve())

#: what a kernel's own code may call on torch at run time (metadata, views, empty allocation)
ALLOWED_AT_RUN = frozenset({
    "__get__",  # property getters: .shape .dtype .T .device .ndim ...
    "size", "dim", "stride", "numel", "is_contiguous", "is_floating_point", "element_size", "storage_offset",
    "__len__", "view", "view_as", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
    "narrow", "select", "split", "chunk", "unbind", "unflatten", "movedim", "swapaxes",
    "empty", "empty_like", "empty_strided", "new_empty", "__format__", "__repr__",
})
#: allowed only when they do not copy
_VIEW_IF_CONTIGUOUS = frozenset({"reshape", "flatten", "contiguous"})


class ComputeGuard(TorchFunctionMode):
    """Records torch compute done by the candidate's own code (not through primitives)."""

    def __init__(self, kernel_file: str):
        super().__init__()
        self.kernel_file = str(Path(kernel_file).resolve())
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if not self._allowed(name, args):
            where = self._kernel_line()
            if where is not None:
                qual = getattr(func, "__qualname__", name)
                if qual.endswith("__get__"):
                    qual = name
                self.violations.append(f"{qual.replace('TensorBase.', 'Tensor.').replace('_VariableFunctionsClass.', 'torch.')} at line {where}")
        return func(*args, **kwargs)

    @staticmethod
    def _allowed(name: str, args) -> bool:
        if name in ALLOWED_AT_RUN:
            return True
        if name in _VIEW_IF_CONTIGUOUS:
            return bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_contiguous()
        if name == "__getitem__":  # basic indexing is a view; tensor indices gather (compute)
            idx = args[1] if len(args) > 1 else None
            items = idx if isinstance(idx, tuple) else (idx,)
            return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)
        return False

    def _kernel_line(self) -> int | None:
        """The kernel's line when this torch call is the kernel's own (no primitives frame
        on the stack), else None."""
        frame = sys._getframe(2)
        line = None
        while frame is not None:
            fname = frame.f_code.co_filename
            if fname.startswith(PRIMITIVES_DIR):
                return None
            if line is None and fname == self.kernel_file:
                line = frame.f_lineno
            frame = frame.f_back
        # torch called from elsewhere (e.g. the task's reference, reached from the kernel
        # with the static rules off) is still the kernel's work when the kernel is on the stack
        return line


@contextmanager
def poisoned_allocations():
    """Uninitialized memory is NaN (ints: max) while the block runs (see the docstring)."""
    import torch.utils.deterministic as det

    # set_deterministic_debug_mode, not use_deterministic_algorithms: the latter imports
    # torch._dynamo (2 s per worker); "warn": ops without a deterministic kernel still run
    was_mode = torch.get_deterministic_debug_mode()
    was_fill = det.fill_uninitialized_memory
    torch.set_deterministic_debug_mode("warn")
    det.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.set_deterministic_debug_mode(was_mode)
        det.fill_uninitialized_memory = was_fill


def _namespaces() -> dict[str, object]:
    import builtins
    import time

    import torch.nn.functional as F
    import torch.profiler

    import tasks.spec
    import tasks.tolerance
    from eval import timing

    spaces = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.functional": F, "torch.profiler": torch.profiler,
              "torch.autograd.profiler": torch.autograd.profiler, "time": time, "builtins": builtins,
              "eval.timing": timing, "tasks.tolerance": tasks.tolerance, "tasks.spec.Task": tasks.spec.Task}
    spaces |= {"torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event}
    for mod in ("eval.numerics", "eval.gpu_stages", "eval.worker"):
        if mod in sys.modules:
            spaces[mod] = sys.modules[mod]
    return spaces


class TamperCheck:
    """Identity of every public callable in the namespaces that judge a kernel."""

    #: torch rebinds these itself (importing torch._dynamo wraps torch.manual_seed), and
    #: patching them cannot change a verdict (inputs come from their own Generators)
    IGNORED = frozenset({"torch.manual_seed"})

    def __init__(self):
        self.before = {(ns, k): id(v) for ns, obj in _namespaces().items() for k, v in _items(obj)}

    def changed(self) -> list[str]:
        now = {(ns, k): id(v) for ns, obj in _namespaces().items() for k, v in _items(obj)}
        changed = (f"{ns}.{k}" for (ns, k), i in self.before.items() if now.get((ns, k)) != i)
        return sorted(c for c in changed if c not in self.IGNORED)


def _items(obj):
    try:
        d = vars(obj)
    except TypeError:
        return []
    # callables and classes only: module-level data (caches, flags) may change legitimately
    return [(k, v) for k, v in list(d.items()) if not k.startswith("__") and (callable(v) or isinstance(v, type))]
