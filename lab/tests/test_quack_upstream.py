"""lab/quack_upstream (issue 16, section 3): the C-load warp as a patch that could be
offered to quack. On a CPU, in about a minute: the generator writes the patch, its test and
its description; a quack other than the one the edits expect fails in one line; the patch
applies cleanly to a copy of the installed quack (the `patch` tool and make_patch's own
applier giving the same file); the patched copy cross-compiles GEMMs whose epilogues load
C (quack's rms_partial_epi and dswiglu_dpreact_mod, and residual_epi's tile load without
C), pingpong and cooperative, with the flag off and on, through the generated test's own
calls; the refused combinations fail with their one-line messages. Beside it the installed,
unpatched quack builds the same GEMMs (epiforge's C-load warp, primitives/c_load_warp.py,
for the flag): with the flag off the patched quack's object is byte-identical to
unpatched quack's, and with it on its SASS is the instruction stream of the kernel measured
on the H200 (lab/results/h200/c-load-warp.md). The GPU test itself (flag on against off,
bit for bit) needs an SM90 GPU: off one, its runner (gpu_test.py) is tested here with every
case skipped, and on the H200 its log is checked (lab/results/h200/quack-upstream/)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.quack_upstream import make_patch
from lab.bench.sass import instructions, sass_of

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_DIR = REPO / "lab" / "quack_upstream"

PP, COOP = (128, 128, 1, 2, True), (256, 128, 2, 1, False)
#: (name, epilogue of the generated test, config, flag, extra gemm arguments)
BUILDS = [(f"{ep} {cname} {'on' if flag else 'off'}", ep, cfg, flag, {})
          for ep in ("rms_partial", "dswiglu_dpreact", "residual_tile")
          for cname, cfg in (("pp_c1x2", PP), ("coop_c2x1", COOP))
          for flag in (False, True)]
BUILDS += [("rms_partial coop_c2x1 on persistent=False", "rms_partial", COOP, True, {"persistent": False}),
           ("rms_partial pp_c1x2 on dynamic", "rms_partial", PP, True, {"dynamic": True}),
           ("scaled_residual pp_c1x2 on batched", "scaled_residual", PP, True, {"batched": True})]
#: what the installed quack with epiforge's C-load warp builds beside it
TWINS = [b for b in BUILDS if b[0].split()[0] in ("rms_partial", "dswiglu_dpreact") and not b[4]
         and (b[2] == PP or b[1] == "rms_partial")]

_BUILD = r"""
import importlib.util, json, os, sys
from pathlib import Path
import torch
test_file, cache, builds = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
twin = sys.argv[4] == "twin"
if twin:  # the installed quack, with epiforge's hooks (primitives/c_load_warp.py behind an attribute)
    from epiforge.primitives import lowering
    lowering._import_quack()
import quack
import quack.gemm_runtime.host as host
# no driver to ask: every SM of an H100/H200 runs one CTA of these kernels
host.get_max_active_clusters = lambda cluster_size, *a, **k: 132 // cluster_size
spec = importlib.util.spec_from_file_location("generated_test", test_file)
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
out = {"quack": quack.__file__, "objects": {}, "refused": {}}
for name, epilogue, cfg, flag, kw in builds:
    cfg = tuple(cfg)
    shape = t.BATCHED if kw.pop("batched", False) else (0, 1000, 776, 320)
    if kw.pop("dynamic", False):
        kw.update(is_dynamic_persistent=True, tile_count_semaphore=torch.zeros(1, dtype=torch.int32))
    before = set(cache.rglob("*.o"))
    if twin:  # the generated test's call, the flag as epiforge's lowering sets it
        mod, A, B, D, C, epi_args, _ = t.make_call(epilogue, shape, cfg, device="cpu")
        mod.gemm(A, B, D, C, epi_args=epi_args, tile_M=cfg[0], tile_N=cfg[1], cluster_M=cfg[2],
                 cluster_N=cfg[3], pingpong=cfg[4], _launch=False,
                 post_init_attrs=((lowering._C_LOAD_ATTR, True),) if flag else (), **kw)
    else:
        t.run(epilogue, shape, cfg, flag, device="cpu", launch=False, **kw)
    (obj,) = set(cache.rglob("*.o")) - before
    out["objects"][name] = str(obj)
if not twin:
    from quack.gemm_sm90 import GemmSm90
    out["default"] = GemmSm90.c_load_warp
    for what, call in t.refused_calls(device="cpu", launch=False).items():
        try:
            call()
            out["refused"][what] = None
        except ValueError as e:
            out["refused"][what] = str(e)
    from types import SimpleNamespace  # a class with its own kernel (GemmSm120's arch)
    stub = SimpleNamespace(arch=120, split_k=1, gather_A=False, varlen_m=False, varlen_k=False, epi_c_stage=4)
    try:
        GemmSm90._check_c_load_warp(stub)
    except ValueError as e:
        out["refused"]["arch 120"] = str(e)
print("RESULT" + json.dumps(out))
"""


def _places(sass: str) -> dict:
    # the producer warpgroup's code runs up to the consumers' register increase
    producer, _, consumer = sass.partition("USETMAXREG.TRY_ALLOC")
    assert consumer, "no consumer register increase in the SASS"
    return {"ldg_producer": producer.count("UTMALDG"), "ldg_consumer": consumer.count("UTMALDG"),
            "gate_wait": sass.count("BAR.SYNC.DEFER_BLOCKING 0x2, 0x40"), "gate_open": sass.count("BAR.ARV 0x2, 0x40")}


def _generate(out: Path) -> dict[str, Path]:
    run = subprocess.run([sys.executable, "-m", "lab.quack_upstream.make_patch", "--out", str(out)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    return {p.name: p for p in out.iterdir()}


@pytest.mark.spawns
def test_the_generator_writes_the_patch_its_test_and_its_description(tmp_path):
    files = _generate(tmp_path)
    assert set(files) == {"c-load-warp.patch", "test_gemm_sm90_c_load_warp.py", "DESCRIPTION.md"}
    patch = files["c-load-warp.patch"].read_text()
    assert patch.startswith("diff --git a/quack/gemm_sm90.py b/quack/gemm_sm90.py\n--- a/quack/gemm_sm90.py\n")
    # only one file changes, and of quack's lines only two: each const_expr condition that
    # builds the epilogue's own C loads, which the flag now also guards
    removed = [ln[1:] for ln in patch.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert patch.count("diff --git") == 1 and len(removed) == 2, removed
    for line in removed:
        assert line.endswith("):") and line[:-2] + " and not self.c_load_warp):" in added
    assert "    c_load_warp = False" in added  # off by default
    assert files["test_gemm_sm90_c_load_warp.py"].read_text() == (
        TEMPLATE_DIR / "template_test_gemm_sm90_c_load_warp.py").read_text()
    assert "{{" not in files["DESCRIPTION.md"].read_text()


def test_every_number_in_the_description_comes_from_a_named_results_file():
    """Each table row of the description is a row of a committed results file it names, and
    every decimal number in it occurs in one of those files."""
    text = (TEMPLATE_DIR / "template_DESCRIPTION.md").read_text()
    named = sorted(set(re.findall(r"lab/results/h200/[\w./-]+\.md", text)))
    assert "lab/results/h200/c-load-warp.md" in named and "lab/results/h200/k7-cl-pick.md" in named
    sources = {n: (REPO / n).read_text() for n in named}
    rows = [ln for ln in text.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    assert len(rows) >= 36
    stray = [r for r in rows if not any(r in s.splitlines() for s in sources.values())]
    assert not stray, stray[:5]
    numbers = set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", text))
    unknown = sorted(x for x in numbers if not any(re.search(rf"(?<![\d.]){re.escape(x)}(?![\d.])", s)
                                                   for s in sources.values()))
    assert not unknown, unknown


@pytest.mark.spawns
def test_a_quack_that_is_not_the_expected_text_fails_in_one_line(tmp_path):
    installed = make_patch.quack_root()
    fake = tmp_path / "checkout" / "quack"
    fake.mkdir(parents=True)
    text = (installed / "quack" / "gemm_sm90.py").read_text()
    (fake / "gemm_sm90.py").write_text(text.replace("ag_last_gate = Int32(-1)", "ag_last_gate = Int32(-2)"))
    with pytest.raises(make_patch.PatchError) as info:
        make_patch.write(tmp_path / "out", root=fake.parent)
    assert "edit 3 (the A/B-load warp's gate flag)" in str(info.value) and "found 0 times" in str(info.value)
    assert not (tmp_path / "out").exists()
    run = subprocess.run([sys.executable, "-m", "lab.quack_upstream.make_patch", "--out",
                          str(tmp_path / "out"), "--quack-root", str(fake.parent)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"make_patch: {fake.parent}'s quack/gemm_sm90.py is not the text edit 3")
    assert run.stderr.strip().endswith("written against quack-kernels 0.6.5")
    # a quack that already has the flag is named as such
    (fake / "gemm_sm90.py").write_text(make_patch.edited()["quack/gemm_sm90.py"][1])
    with pytest.raises(make_patch.PatchError, match="already has a c_load_warp"):
        make_patch.write(tmp_path / "out", root=fake.parent)


@pytest.mark.spawns
def test_the_patch_applies_and_cross_compiles_for_sm90a_with_the_flag_off_and_on(tmp_path):
    files = _generate(tmp_path / "out")
    installed = make_patch.quack_root() / "quack"
    site = tmp_path / "site"
    shutil.copytree(installed, site / "quack", ignore=shutil.ignore_patterns("__pycache__"))
    patch_file = files["c-load-warp.patch"]
    # make_patch's own applier, on a copy of the one file
    (tmp_path / "py" / "quack").mkdir(parents=True)
    shutil.copy(installed / "gemm_sm90.py", tmp_path / "py" / "quack" / "gemm_sm90.py")
    assert make_patch.apply_patch(patch_file.read_text(), tmp_path / "py") == ["quack/gemm_sm90.py"]
    once = (tmp_path / "py" / "quack" / "gemm_sm90.py").read_text()
    with pytest.raises(make_patch.PatchError, match="does not match"):  # a second time: no hunk is where it was
        make_patch.apply_patch(patch_file.read_text(), tmp_path / "py")
    assert (tmp_path / "py" / "quack" / "gemm_sm90.py").read_text() == once
    if shutil.which("patch"):
        applied = subprocess.run(["patch", "-p1", "-F0", "--batch", "--no-backup-if-mismatch", "-i", str(patch_file)],
                                 capture_output=True, text=True, cwd=site, timeout=60)
        assert applied.returncode == 0 and applied.stdout.strip() == "patching file quack/gemm_sm90.py", applied.stdout
        assert (site / "quack" / "gemm_sm90.py").read_text() == (tmp_path / "py" / "quack" / "gemm_sm90.py").read_text()
    else:
        make_patch.apply_patch(patch_file.read_text(), site)

    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a", "QUACK_ARCH": "90", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    procs = {}
    for kind, builds, path in (("patched", BUILDS, site), ("twin", TWINS, REPO)):
        cache = tmp_path / f"cache-{kind}"
        cache.mkdir()
        procs[kind] = subprocess.Popen(
            [sys.executable, "-c", _BUILD, str(files["test_gemm_sm90_c_load_warp.py"]), str(cache), json.dumps(builds),
             kind], env={**env, "QUACK_CACHE_DIR": str(cache), "PYTHONPATH": str(path)}, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got = {}
    for kind, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{kind}: {stderr[-3000:]}"
        (line,) = [ln for ln in stdout.splitlines() if ln.startswith("RESULT")]
        got[kind] = json.loads(line[len("RESULT"):])
    patched, twin = got["patched"], got["twin"]
    assert Path(patched["quack"]).is_relative_to(site) and not Path(twin["quack"]).is_relative_to(site)
    assert patched["default"] is False

    # every build compiled; the flag is part of quack's compile key (its own object)
    objects = {name: Path(p) for name, p in patched["objects"].items()}
    assert set(objects) == {b[0] for b in BUILDS} and len(set(objects.values())) == len(BUILDS)
    # where the C loads are: the consumers' before, one load of the producer warpgroup's after,
    # behind the A/B-load warp's gate (named barrier 2, 64 threads)
    for name, *_ in BUILDS:
        if " on" not in name:
            continue
        on = _places(sass_of(objects[name]))
        assert on["ldg_consumer"] == 0 and on["gate_wait"] == on["gate_open"] == 1, (name, on)
        if name.endswith(" on"):
            off = _places(sass_of(objects[name[:-3] + " off"]))
            assert off["ldg_consumer"] > 0 and off["gate_wait"] == off["gate_open"] == 0, (name, off)
            assert on == {**off, "ldg_consumer": 0, "ldg_producer": off["ldg_producer"] + 1,
                          "gate_wait": 1, "gate_open": 1}, (name, off, on)
    # flag off: the very object unpatched quack builds; flag on: the instruction stream of
    # epiforge's C-load warp, the kernel timed on the H200
    for name, *_ in TWINS:
        ours, theirs = objects[name], Path(twin["objects"][name])
        if name.endswith(" off"):
            assert ours.read_bytes() == theirs.read_bytes(), name
        else:
            assert instructions(sass_of(ours)) == instructions(sass_of(theirs)), name

    refused = patched["refused"]
    expected = {"loads no C": "c_load_warp: this GEMM loads no C and no epilogue tile; there is nothing to load",
                "split_k": "c_load_warp: split_k > 1 is not supported (only the finalizing split would load C)",
                "varlen_m": "c_load_warp: varlen_m / varlen_k are not supported (their per-tile C count is dynamic)",
                "gather_A": "c_load_warp: gather_A takes every producer warp for A; not supported",
                "arch 120": "c_load_warp: only GemmSm90's own SM90 kernel has the C-load warp (arch 120)"}
    assert refused == expected


def test_shards_keep_each_kernels_cases_together():
    from lab.quack_upstream.gpu_test import shard

    ids = [f"t.py::test_same_bits[{ep}-{cfg}-{shape}]" for ep in ("a", "b") for cfg in ("c1", "c2", "c3")
           for shape in ("s1", "s2")] + ["t.py::test_computes", "t.py::test_refusals[split_k]"]
    groups = shard(ids, 4)
    assert len(groups) == 4 and sorted(x for g in groups for x in g) == sorted(ids)
    kernel = {x: x.rsplit("-", 1)[0] for x in ids if "same_bits" in x}
    for g in groups:  # no kernel's cases in two shards
        assert not {kernel[x] for x in g if x in kernel} & {kernel[x] for h in groups if h is not g for x in h if x in kernel}
    assert max(map(len, groups)) - min(map(len, groups)) <= 2
    assert shard(ids[:2], 8) == [ids[:2]]


@pytest.mark.spawns
def test_the_gpu_test_runs_the_generated_test_against_the_patched_copy(tmp_path):
    """lab/quack_upstream/gpu_test.py, off a GPU: it patches a copy of the installed quack,
    the generated test imports that copy, every case is collected, sharded and (here) skipped
    by the test's own SM90 check; the log says so, and the installed quack is untouched."""
    installed = make_patch.quack_root() / "quack" / "gemm_sm90.py"
    before = installed.read_bytes()
    out = subprocess.run([sys.executable, "-m", "lab.quack_upstream.gpu_test", "--out", str(tmp_path),
                          "--shards", "2"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    log = (tmp_path / "pytest-gpu-quack-upstream.log").read_text()
    head = log.splitlines()
    assert head[0].startswith("environment: ") and json.loads(head[0][len("environment: "):])["quack-kernels"] == "0.6.5"
    m = re.search(r"quack imported from the patched copy \(its c_load_warp default False\); (\d+) cases in 2 shards", log)
    assert m and int(m[1]) >= 100
    skipped = sum(int(x) for x in re.findall(r"^(\d+) skipped", log, flags=re.M))
    assert skipped == int(m[1]) and "needs an SM90 GPU" in log and "passed" not in log and "failed" not in log
    assert (tmp_path / "DESCRIPTION.md").is_file() and installed.read_bytes() == before
    bad = subprocess.run([sys.executable, "-m", "lab.quack_upstream.gpu_test", "--out", str(tmp_path),
                          "--shards", "0"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "--shards must be at least 1" in bad.stderr
    # one deadline for all the shards: past it the rest are killed and the log says so
    cut = subprocess.run([sys.executable, "-m", "lab.quack_upstream.gpu_test", "--out", str(tmp_path / "cut"),
                          "--shards", "2", "--timeout", "0.5"], capture_output=True, text=True, cwd=REPO, timeout=600)
    cut_log = (tmp_path / "cut" / "pytest-gpu-quack-upstream.log").read_text()
    assert cut.returncode == 124 and cut_log.count("(killed after 0 s)") == 2 and "(running)" not in cut_log


def test_the_generated_test_passed_on_the_h200_against_the_patched_quack():
    """lab/bench/h200.sh quack-upstream: every case of the generated test, on a patched copy of
    quack-kernels 0.6.5, on an H200; none failed or skipped, and the count is the file's."""
    log = (REPO / "lab" / "results" / "h200" / "quack-upstream" / "pytest-gpu-quack-upstream.log").read_text()
    env = json.loads(log.splitlines()[0][len("environment: "):])
    assert env["gpu"] == "NVIDIA H200" and env["quack-kernels"] == "0.6.5" and env["commit"]
    m = re.search(r"quack imported from the patched copy \(its c_load_warp default False\); (\d+) cases in (\d+) shards", log)
    passed = [int(x) for x in re.findall(r"^(\d+) passed(?:, \d+ warnings?)? in ", log, flags=re.M)]
    assert m and len(passed) == int(m[2]) and sum(passed) == int(m[1]) >= 100
    assert not re.search(r"failed|skipped|error|killed", log, flags=re.I)
