"""eval.precompiled.install_precompiled installs only objects built from this checkout's
sources (the digest bench.precompile writes beside them); anything else compiles on the GPU
instead of running stale code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from pathlib import Path
from epiforge.eval.precompiled import install_precompiled
from quack.cache.jit import _compute_source_fingerprint, get_cache_path
n = install_precompiled(Path(sys.argv[1]))
print(json.dumps({"installed": n, "there": sorted(p.name for p in (get_cache_path() / _compute_source_fingerprint()).glob("*.o"))}))
"""


def _install(tmp_path, digest):
    src = tmp_path / "carried"
    (src / "some-fingerprint").mkdir(parents=True, exist_ok=True)
    (src / "some-fingerprint" / "kernel.o").write_bytes(b"not really an object")
    if digest is not None:
        (src / "sources.json").write_text(json.dumps({"digest": digest}))
    env = {**os.environ, "QUACK_CACHE_DIR": str(tmp_path / f"dest-{digest}"), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(src)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_only_objects_built_from_these_sources_are_installed(tmp_path):
    from epiforge.eval.precompiled import sources_digest

    got, err = _install(tmp_path, "0" * 64)
    assert got == {"installed": 0, "there": []} and "built from other sources" in err
    got, err = _install(tmp_path, None)  # a cache from before the digest: not trusted either
    assert got["installed"] == 0 and "built from other sources" in err
    got, err = _install(tmp_path, sources_digest())
    assert got == {"installed": 1, "there": ["kernel.o"]} and "other sources" not in err


def test_the_digest_follows_the_primitives(tmp_path):
    from epiforge.eval.precompiled import sources_digest

    copy = tmp_path / "primitives"
    copy.mkdir()
    for f in (REPO / "primitives").glob("*.py"):
        (copy / f.name).write_bytes(f.read_bytes())
    assert sources_digest([copy]) == sources_digest()  # the same files: the same digest
    (copy / "lowering.py").write_text((copy / "lowering.py").read_text() + "\n# an edit\n")
    assert sources_digest([copy]) != sources_digest()
