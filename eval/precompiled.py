"""Objects compiled on a CPU, carried to a GPU machine and installed into its quack cache
there, so that a GPU session does not compile (quack names its cache folder after a
fingerprint that hashes the Python version, which differs between the two machines; the
objects' own names do not). So that objects built from other sources never run in their
place, the build writes a digest of the sources beside them (`sources_digest`, the same on
both machines) and only objects with this checkout's digest are installed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from epiforge.eval.machine import STATE_DIR

#: quack's object cache as a CPU fills it (python -m lab.bench.precompile) and a GPU session carries it
CACHE_DIR = STATE_DIR / "quack-cache"
#: the file beside precompiled objects that names the sources they were built from
SOURCES_FILE = "sources.json"


def sources_digest(roots: list[Path] | None = None) -> str:
    """A digest of what a compiled kernel depends on that this repo controls or pins: every
    Python file under primitives/ (by path and content) and the quack and CuTe-DSL versions.
    Unlike quack's own fingerprint it holds no machine detail (Python's version), so a CPU
    build and the GPU that loads it agree on it. roots: other source folders than primitives/."""
    import hashlib
    from importlib import metadata

    from epiforge.primitives.lowering import _REPO_SOURCES

    h = hashlib.sha256()
    for pkg in ("quack-kernels", "nvidia-cutlass-dsl"):
        try:
            h.update(f"{pkg}=={metadata.version(pkg)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{pkg} missing\n".encode())
    for root in roots if roots is not None else _REPO_SOURCES:
        for path in sorted(Path(root).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def install_precompiled(source: Path = CACHE_DIR) -> int:
    """Copy carried .o files (from `source`, default the carried cache;
    lab.bench.configs.LINEINFO_CACHE_DIR for the objects with line info, into a
    QUACK_CACHE_DIR of their own) into quack's cache for this machine; returns how many.
    Objects built from other sources (SOURCES_FILE's digest is not this checkout's) are not
    installed: one line on stderr says so, and the kernels compile here instead."""
    from epiforge.primitives.lowering import _import_quack

    if not any(Path(source).glob("*/*.o")):
        return 0
    try:
        built_from = json.loads((Path(source) / SOURCES_FILE).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):  # none (a cache from before the digest), or not ours
        built_from = None
    if built_from != sources_digest():
        print(f"precompiled objects in {Path(source).name} were built from other sources than this checkout's "
              f"(run python -m lab.bench.precompile again): none installed, kernels compile here",
              file=sys.stderr, flush=True)
        return 0
    _import_quack()  # registers primitives/ in the fingerprint before it is computed
    from quack.cache.jit import _compute_source_fingerprint, get_cache_path

    dest = get_cache_path() / _compute_source_fingerprint()
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for obj in Path(source).glob("*/*.o"):
        target = dest / obj.name
        if not target.exists():
            shutil.copyfile(obj, target)
            n += 1
    return n
