"""lab.path_files: the product modules a command's processes import, traced through PYTHONPATH."""

import pytest

from lab.path_files import files_of, trace

pytestmark = pytest.mark.spawns  # it runs the command


def test_a_command_s_modules_are_traced_and_mapped_to_product_files():
    code, names = trace(["tasks", "show", "k1"], timeout_s=120)
    assert code == 0 and "epiforge.cli" in names and "epiforge.tasks" in names
    files = [str(f) for f in files_of(names)]
    assert "epiforge/cli.py" in files and "tasks/__init__.py" in files and "tasks/spec.py" in files
    assert not any(f.startswith(("lab/", "tests/")) for f in files)
    assert "eval/judge.py" not in files  # nothing judged: no judge imported
