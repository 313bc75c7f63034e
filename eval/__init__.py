"""The evaluator: static checks, isolation, numerics, (on a GPU) launches, timing and
plausibility; see evaluate(). Names load lazily, so `epiforge.eval.store` and the pure modules
(launches, plausibility, static_checks) import without torch."""

from importlib import import_module

_NAMES = {
    "evaluate": "epiforge.eval.evaluation",
    "Kernel": "epiforge.eval.kernel", "KernelError": "epiforge.eval.kernel", "read_kernel": "epiforge.eval.kernel", "resolve_kernel": "epiforge.eval.kernel",
    "Outcome": "epiforge.eval.result", "Result": "epiforge.eval.result", "ShapeResult": "epiforge.eval.result",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        value = getattr(import_module(_NAMES[name]), name)
        # bind it here, once resolved
        globals()[name] = value
        return value
    raise AttributeError(f"module 'eval' has no attribute {name!r}")
