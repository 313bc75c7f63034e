"""Packaging: a built wheel installs one top-level name, `epiforge`, with every module and
data file the code reads; installed elsewhere it judges a kernel (its judge and runner
processes import it from there); and the kernel-facing `import primitives` is an alias of
epiforge.primitives, never a second copy."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from epiforge.eval.machine import REPO

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

CODE = ("primitives", "tasks", "eval", "agent", "training", "human_kernels")
DATA = ("primitive_docs", "generated_kernels", "logs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the tracked files, as a clean clone would be (no build/ left in
    the checkout, nothing untracked carried in)."""
    import shutil

    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=REPO, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out)], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path_factory.mktemp("cwd"))
    assert build.returncode == 0, build.stderr[-2000:]
    BUILD_OUTPUT.append(build.stdout + build.stderr)
    (path,) = out.glob("epiforge-*.whl")
    return path


#: what the wheel's build printed (the fixture's)
BUILD_OUTPUT: list[str] = []


def test_the_build_prints_no_warning_of_ours(wheel):
    """setuptools warns once per data folder named like a package that setup.py does not list
    (e.g. agent/data); setup.py lists them."""
    (printed,) = BUILD_OUTPUT
    assert "absent from the `packages` configuration" not in printed and "Warning" not in printed, printed[-3000:]


def _tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", folder], capture_output=True, text=True, cwd=REPO, check=True)
    return [line for line in out.stdout.splitlines() if line]


def test_the_wheel_has_one_top_level_name_and_every_file_the_code_reads(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"epiforge"}
    inside = {n.removeprefix("epiforge/") for n in names if n.startswith("epiforge/")}
    wanted = [f for top in CODE for f in _tracked(top) if f.endswith((".py", ".toml", ".md", ".j2", ".jsonl", ".json"))]
    wanted += [f for top in DATA for f in _tracked(top)]
    wanted += ["cli.py", "__init__.py", "__main__.py"]
    missing = [f for f in wanted if f not in inside]
    assert not missing, missing[:20]
    assert "conftest.py" not in inside and not any(n.startswith(("pending/", "tests/")) for n in inside)


def test_installed_elsewhere_it_lists_tasks_and_judges_a_kernel(wheel, tmp_path):
    target = tmp_path / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-2000:]
    assert not (target / "eval").exists() and not (target / "tasks").exists() and (target / "epiforge").is_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "EPIFORGE_DATA_DIR": str(tmp_path / "data")}
    where = subprocess.run([sys.executable, "-c", "import epiforge; print(epiforge.ROOT, epiforge.CHECKOUT)"],
                           capture_output=True, text=True, env=env, cwd=elsewhere, timeout=120)
    assert where.stdout.split() == [str((target / "epiforge").resolve()), "False"], where.stderr
    listed = subprocess.run([sys.executable, "-m", "epiforge", "tasks", "list", "--json"], capture_output=True,
                            text=True, env=env, cwd=elsewhere, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "k1_gemm_rmsnorm" in {t["name"] for t in json.loads(listed.stdout)}
    kernel = target / "epiforge" / "human_kernels" / "k1_gemm_rmsnorm.py"
    judged = subprocess.run([sys.executable, "-m", "epiforge", "eval", "--task", "k1", "--kernel", str(kernel),
                             "--device", "cpu", "--shapes", "smoke", "--json"], capture_output=True, text=True, env=env,
                            cwd=elsewhere, timeout=900)
    assert judged.returncode == 0, (judged.stdout[-1500:], judged.stderr[-1500:])
    result = json.loads(judged.stdout)
    assert result["outcome"] == "PASSED", result.get("message")


ALIAS = """
import epiforge
import primitives as P
import primitives.config as config
assert P is epiforge.primitives and config is epiforge.primitives.config
assert P.__spec__.name == "epiforge.primitives" and P.__name__ == "epiforge.primitives"
from primitives import epilogue
assert epilogue is epiforge.primitives.epilogue
print("alias ok")
"""

BARE = """
import sys
sys.path.insert(0, sys.argv[1])
try:
    import primitives
except ImportError as e:
    print("refused:", e)
"""


def test_the_kernel_facing_name_is_the_same_module():
    out = subprocess.run([sys.executable, "-c", ALIAS], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "alias ok", out.stderr[-1500:]


def test_primitives_loaded_under_its_bare_name_without_epiforge_is_refused():
    """A process that puts the repo root on sys.path and imports `primitives` without epiforge
    would hold a second copy of the contract; it gets one clear ImportError instead."""
    out = subprocess.run([sys.executable, "-c", BARE, str(REPO)], capture_output=True, text=True, timeout=120,
                         cwd=REPO / "tests")
    assert out.stdout.startswith("refused:") and "import epiforge first" in out.stdout, (out.stdout, out.stderr)


def test_the_product_never_imports_the_lab_and_the_wheel_leaves_it_out(wheel):
    """lab/ (the bench scripts, studies, the quack patch, every result) imports the product,
    never the other way round, and it is not installed: no module of the package folders
    names `lab`, no wheel file is under it or the old bench/, and no folder of the wheel is a
    results folder."""
    import ast

    offenders = []
    for top in (*CODE, "epiforge"):
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                if any(n == "lab" or n.startswith("lab.") for n in names):
                    offenders.append(str(path.relative_to(REPO)))
    assert offenders == []
    assert (REPO / "lab" / "quack_upstream" / "make_patch.py").is_file()
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("lab/", "epiforge/lab/", "epiforge/bench/"))]
    folders = {part for n in names if n.startswith("epiforge/") for part in n.split("/")[1:-1]}
    assert "results" not in folders


def test_the_tests_mirror_the_packages():
    """tests/<package>/ holds the tests of each product package (tests/exploits: the judge's
    exploit suite, eval's); tests/'s top only those of epiforge/ itself and of the suite's
    own rules; the lab's tests are lab/tests/."""
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= {*CODE, "exploits"}, folders - {*CODE, "exploits"}
    top = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert top <= {"test_packaging.py", "test_text.py", "test_conftest_spawns.py"}, top
    # product tests that also use a lab tool (its config lists, its SASS reader, its lead study):
    # to be split; no new one
    mixed = {"tests/eval/test_compare.py", "tests/eval/test_timed_lead.py", "tests/primitives/test_c_load_warp.py",
             "tests/primitives/test_epilogue_graph.py", "tests/primitives/test_gemm_config.py"}
    lab_imports = {p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("*.py") if p.name != "test_packaging.py"
                   and any(line.lstrip().startswith(("from lab.", "import lab.")) for line in p.read_text().splitlines())}
    assert lab_imports <= mixed, lab_imports - mixed
