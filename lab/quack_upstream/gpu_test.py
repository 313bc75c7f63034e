"""Run the patch's own quack-side test (the generated test_gemm_sm90_c_load_warp.py) against
a patched copy of the installed quack, the way quack's suite would run it: on an SM90 GPU,
every case of the file, flag on against flag off, bit for bit.

    python -m lab.quack_upstream.gpu_test --out $OUT [--shards 8]

The copy lives in a temporary folder named site-packages (quack then treats its own sources as
an installed package's); the installed quack is not touched. The cases run in --shards pytest
processes side by side, because each kernel's first call compiles (tens of seconds) and the
compiles are what takes the time; the cases of one kernel stay in one process (shard). The log
($OUT/pytest-gpu-quack-upstream.log) starts with the machine's fingerprint and which quack
the test imported. Off a GPU every case skips (the test's own skip), which is how the
machinery is tested in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.quack_upstream import make_patch

LOG_NAME = "pytest-gpu-quack-upstream.log"

_WHICH_QUACK = ("import json, quack\nfrom quack.gemm_sm90 import GemmSm90\n"
                "print(json.dumps({'quack': quack.__file__, 'default': GemmSm90.c_load_warp, "
                "'patched': hasattr(GemmSm90, 'c_load_warp_loop')}))")


def patched_copy(work: Path) -> tuple[Path, dict[str, Path]]:
    """(the site-packages folder holding a patched copy of the installed quack, the generated
    files {"patch", "test", "description"}); raises make_patch.PatchError in one line."""
    files = make_patch.write(work / "generated")
    site = work / "site-packages"
    shutil.copytree(make_patch.quack_root() / "quack", site / "quack", ignore=shutil.ignore_patterns("__pycache__"))
    make_patch.apply_patch(files["patch"].read_text(), site)
    return site, files


def shard(ids: list[str], n: int) -> list[list[str]]:
    """The test ids in at most n groups, the cases that share a compiled kernel together (a
    case's epilogue and config, its first two parameters; its shape does not recompile), so
    that the same-bits cases of one kernel compile it once; the largest groups placed first,
    each on the shard with the fewest cases."""
    by_kernel: dict[str, list[str]] = {}
    for test_id in ids:
        name, _, params = test_id.partition("[")
        parts = params.rstrip("]").split("-")
        by_kernel.setdefault(f"{name}[{'-'.join(parts[:2])}" if len(parts) > 2 else test_id, []).append(test_id)
    shards: list[list[str]] = [[] for _ in range(min(n, len(by_kernel)))]
    for group in sorted(by_kernel.values(), key=len, reverse=True):
        min(shards, key=len).extend(group)
    return [s for s in shards if s]


def _pytest(args: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def run(out: Path, shards: int, timeout_s: float, command: str) -> int:
    """Patch, collect, run the shards, write the log; the exit status is pytest's worst. One
    deadline for all the shards; the log is rewritten as each shard ends, so a run cut off
    from outside keeps the shards that finished."""
    from lab.bench.compare_export import scrub_paths
    from epiforge.eval.machine import fingerprint

    out.mkdir(parents=True, exist_ok=True)
    log = out / LOG_NAME
    with tempfile.TemporaryDirectory(prefix="quack-upstream-") as tmp:
        work = Path(tmp)
        site, files = patched_copy(work)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
        which = subprocess.run([sys.executable, "-c", _WHICH_QUACK], env=env, capture_output=True, text=True,
                               timeout=300)
        if which.returncode != 0:
            raise RuntimeError(f"the patched quack does not import: {which.stderr.strip().splitlines()[-1:]}")
        imported = json.loads(which.stdout.strip().splitlines()[-1])
        if not (imported["quack"] and Path(imported["quack"]).is_relative_to(site) and imported["patched"]):
            raise RuntimeError(f"the test would import {imported['quack']}, not the patched copy")
        test = files["test"]
        collected = _pytest(["--collect-only", "-q", test.name], env, test.parent, 600)
        ids = [line for line in collected.stdout.splitlines() if "::" in line]
        if collected.returncode != 0 or not ids:
            raise RuntimeError(f"collection failed (pytest exit {collected.returncode}): "
                               f"{(collected.stdout + collected.stderr).strip()[-500:]}")
        groups = shard(ids, shards)
        head = [f"environment: {json.dumps(fingerprint('cuda', command))}",
                f"quack imported from the patched copy (its c_load_warp default {imported['default']}); "
                f"{len(ids)} cases in {len(groups)} shards; the patch: {make_patch.diffstat(make_patch.edited())}"]
        outputs = [work / f"shard-{i + 1}.txt" for i in range(len(groups))]
        procs = []
        for g, path in zip(groups, outputs):
            with path.open("w") as f:  # a file, not a pipe: a shard never waits on a reader
                procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                                               "-rfEXs", *g], env=env, cwd=test.parent, stdout=f,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        codes: list[int | None] = [None] * len(procs)
        ends = [""] * len(procs)

        def write_log():
            body = [f"== shard {i + 1}: {len(g)} cases\n"
                    f"{scrub_paths(outputs[i].read_text()).strip() if codes[i] is not None else '(running)'}{ends[i]}"
                    for i, g in enumerate(groups)]
            log.write_text("\n".join(head + body) + "\n")

        while None in codes:
            for i, proc in enumerate(procs):
                if codes[i] is None and proc.poll() is not None:
                    codes[i] = proc.returncode
                    write_log()
            if None in codes and time.monotonic() > deadline:
                for i, proc in enumerate(procs):
                    if codes[i] is None:
                        proc.kill()
                        proc.wait()
                        codes[i], ends[i] = 124, f"\n(killed after {timeout_s:.0f} s)"
                write_log()
            time.sleep(0.5)
        write_log()
        shutil.copy(files["description"], out / "DESCRIPTION.md")
    return max(c for c in codes if c is not None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help=f"the folder for {LOG_NAME} and the patch's DESCRIPTION.md")
    ap.add_argument("--shards", type=int, default=8, help="pytest processes side by side (default 8)")
    ap.add_argument("--timeout", type=float, default=540,
                    help="seconds for all the shards together, after which the rest are killed (default 540)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    command = "python -m lab.quack_upstream.gpu_test " + " ".join(argv if argv is not None else sys.argv[1:])
    try:
        code = run(args.out, args.shards, args.timeout, command)
    except (make_patch.PatchError, RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"gpu_test: {e}", file=sys.stderr)
        return 1
    print(f"{args.out / LOG_NAME}: pytest exit {code}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
