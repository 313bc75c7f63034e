"""The evaluator: static checks, isolation, numerics, (on a GPU) timing; see evaluate()."""

from eval.evaluate import evaluate
from eval.kernel import Kernel, KernelError, read_kernel, resolve_kernel
from eval.result import Outcome, Result, ShapeResult

__all__ = ["evaluate", "Kernel", "KernelError", "Outcome", "Result", "ShapeResult", "read_kernel", "resolve_kernel"]
