"""Run-time guards around a candidate's calls inside the kernel runner (eval/runner.py),
behind the static rules. They keep honest-but-wrong kernels honest; the verdict itself is
the judge's (eval/judge.py), which checks every output against its references.

ComputeGuard (the CPU's launch check, with primitives/trace.py's record of fused GEMMs and
finishing steps). On a GPU the torch profiler shows every kernel a call launches; on a CPU
nothing launches, so the guard watches torch instead: a TorchFunctionMode sees every torch
function and Tensor method called while run() runs, and judges it by the nearest Python
frame outside torch that made it:
  primitives/             the primitives' own work (the emulator, finishing steps): allowed
  the kernel file         in run() and its helpers: only metadata, views and empty
                          allocations; inside an epilogue body (called by the emulator):
                          also the elementwise arithmetic operators, which the GPU
                          compiles into the epilogue
  any other file          while the kernel is on the stack (e.g. the kernel reached a
                          task's reference code): compute, reported
Anything reported would be one more kernel launch on the GPU (EXTRA_LAUNCHES).

Poison (the outputs poisoned before each checked call). Kernels return fresh tensors, so
the "output buffer" is whatever the allocator hands out inside run(); a kernel that leaves
elements unwritten reads stale memory. While a checked call runs, torch's deterministic
mode fills every uninitialized allocation (torch.empty & co., the primitives' and quack's
output buffers included) with NaN (integers: their maximum), so any element the kernel did
not write fails the judge's NaN check. Timed calls are not poisoned (the fill is a launch);
the judge compares their outputs with the checked ones instead.

Tamper: a snapshot of the callables of torch, the timers, the profiler and the runner's
own code taken before the kernel is imported; a kernel that patched any of them is
reported.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from epiforge import ROOT

PRIMITIVES_DIR = str(ROOT / "primitives") + "/"
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


#: what an epilogue body may do to torch values on the CPU: the elementwise arithmetic
#: the GPU compiles (the emulator calls the body with torch tensors)
ALLOWED_IN_EPILOGUE = ALLOWED_AT_RUN | frozenset({
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__neg__", "__pos__", "__pow__", "__rpow__", "__abs__",
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "add", "sub", "mul", "div", "neg",
})


class ComputeGuard(TorchFunctionMode):
    """Records torch compute done by the candidate's own code (not through primitives)."""

    def __init__(self, kernel_file: str):
        super().__init__()
        self.kernel_file = str(Path(kernel_file).resolve())
        self.violations: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        verdict = self._judge(name, args)
        if verdict is not None:
            qual = getattr(func, "__qualname__", name)
            if qual.endswith("__get__"):
                qual = name
            qual = qual.replace("TensorBase.", "Tensor.").replace("_VariableFunctionsClass.", "torch.")
            self.violations.append(f"{qual} {verdict}")
        return func(*args, **kwargs)

    def _judge(self, name: str, args) -> str | None:
        """None when the call is allowed, else where it came from (for the message)."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        if frame is None:
            return None
        fname = frame.f_code.co_filename
        if fname.startswith(PRIMITIVES_DIR) or fname == _HERE:
            return None
        if fname == self.kernel_file:
            caller = frame.f_back
            while caller is not None and caller.f_code.co_filename == self.kernel_file:
                caller = caller.f_back
            in_body = caller is not None and caller.f_code.co_filename.startswith(PRIMITIVES_DIR)
            allowed = ALLOWED_IN_EPILOGUE if in_body else ALLOWED_AT_RUN
            if self._allowed(name, args, allowed):
                return None
            return f"at line {frame.f_lineno}" + (" (inside an epilogue body)" if in_body else "")
        # torch called from another module: the kernel's work only when the kernel is on the stack
        up = frame
        while up is not None:
            if up.f_code.co_filename == self.kernel_file:
                return f"in {Path(fname).name}:{frame.f_lineno}, reached from the kernel's line {up.f_lineno}"
            if up.f_code.co_filename.startswith(PRIMITIVES_DIR):
                return None
            up = up.f_back
        return None

    @staticmethod
    def _allowed(name: str, args, allowed=ALLOWED_AT_RUN) -> bool:
        if name in allowed:
            return True
        if name in _VIEW_IF_CONTIGUOUS:
            return bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_contiguous()
        if name == "__getitem__":  # basic indexing is a view; tensor indices gather (compute)
            idx = args[1] if len(args) > 1 else None
            items = idx if isinstance(idx, tuple) else (idx,)
            return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)
        return False


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
    """What the runner relies on while it runs a kernel: torch, the timers, the profiler,
    builtins and its own modules (the judge's namespaces are in another process)."""
    import builtins
    import time

    import torch.nn.functional as F
    import torch.profiler

    from epiforge.eval import channel, timing

    spaces = {"torch": torch, "torch.Tensor": torch.Tensor, "torch.nn.functional": F, "torch.profiler": torch.profiler,
              "torch.autograd.profiler": torch.autograd.profiler, "time": time, "builtins": builtins,
              "eval.timing": timing, "eval.channel": channel, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event}
    for mod in ("epiforge.eval.runner", "epiforge.eval.guard", "epiforge.primitives.trace"):
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
