"""epiforge: an LLM agent writes fused GEMM-epilogue kernels for Transformer training, and an
evaluator proves them right and fast. Everything lives under this one name:

    epiforge.cli            the command line (`epiforge ...`, `python -m epiforge ...`)
    epiforge.text           wording shared by the commands' output (counted: '1 turn', '2 turns')
    epiforge.primitives     the epilogue contract: CPU emulator and lowering onto quack
    epiforge.tasks          the task specs, references and tolerance rule
    epiforge.eval           the judge: static checks, isolation, numerics, timing, the store,
                            the compare baselines
    epiforge.agent          the agent loop, its backends, replay and ablations
    epiforge.training       the fused layer and model as torch custom ops
    epiforge.human_kernels  the expert kernels (data: kernel files)
    primitive_docs, generated_kernels, logs   shipped data (ROOT / name)

In a checkout the folders sit at the repository root beside this package, which reaches
them through its __path__; installed, they are its subfolders. ROOT is the folder holding
them either way.

Kernels keep the short import `import primitives as P`: importing epiforge installs a
finder that answers the one name `primitives` (and its submodules) with epiforge.primitives,
the same module objects, so no generic top-level name is ever installed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
#: a checkout: the package folders are the repository root's, beside this one
CHECKOUT = (_HERE.parent / "pyproject.toml").is_file() and (_HERE.parent / "eval" / "__init__.py").is_file()
#: the folder that holds primitives/, eval/, ..., primitive_docs/ (the repo root, or this package)
ROOT = _HERE.parent if CHECKOUT else _HERE
#: what a child process needs on PYTHONPATH to import epiforge
IMPORT_ROOT = _HERE.parent
if CHECKOUT:
    __path__.append(str(ROOT))  # noqa: F821 (a package's own __path__)

KERNEL_FACING = "primitives"


class _KernelFacingName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import primitives[.x]` -> epiforge.primitives[.x], the very same module objects."""

    def __init__(self):
        self._specs = {}

    def find_spec(self, name, path=None, target=None):
        if name == KERNEL_FACING or name.startswith(KERNEL_FACING + "."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{spec.name}")
        self._specs[spec.name] = module.__spec__  # the import system sets the alias's spec on it next
        return module

    def exec_module(self, module):
        # already executed under its epiforge name; it keeps its own spec
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


if not any(isinstance(f, _KernelFacingName) for f in sys.meta_path):
    sys.meta_path.insert(0, _KernelFacingName())


def main(argv=None) -> int:
    from epiforge.cli import main as cli_main

    return cli_main(argv)
