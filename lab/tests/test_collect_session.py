"""lab/collect_session.py: a finished session's log is copied line for line, byte for byte,
but for session_ended's generated_kernel, which names the kernel's place in the repository;
the kernel and its origin.json go beside it; an unfinished session or a second copy is refused."""

import json
import shutil
from pathlib import Path

import pytest

from lab.collect_session import collect

REPO = Path(__file__).resolve().parents[2]


def test_a_session_is_copied_with_one_field_rewritten(tmp_path):
    shipped = sorted((REPO / "logs" / "generated").glob("*-k8-*.jsonl"))[0]
    lines = shipped.read_bytes().splitlines(keepends=True)
    end = json.loads(lines[-1])
    kernel = REPO / end["generated_kernel"]
    # the session as the harness left it: its kernel in a scratch folder, named by that path
    scratch = tmp_path / "data" / "kernels" / kernel.parent.name
    scratch.mkdir(parents=True)
    shutil.copy(kernel, scratch / kernel.name)
    shutil.copy(kernel.with_suffix(".origin.json"), scratch / kernel.with_suffix(".origin.json").name)
    log = tmp_path / "data" / "sessions" / shipped.name
    log.parent.mkdir(parents=True)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1].replace(json.dumps(end["generated_kernel"]).encode(),
                                                             json.dumps(str(scratch / kernel.name)).encode()))
    repo = tmp_path / "repo"
    said = collect(log, repo=repo)
    assert said.endswith(f"kernel -> generated_kernels/{kernel.parent.name}/{kernel.name}")
    assert (repo / "logs" / "generated" / shipped.name).read_bytes() == shipped.read_bytes()  # the path as shipped
    assert (repo / end["generated_kernel"]).read_bytes() == kernel.read_bytes()
    assert (repo / end["generated_kernel"]).with_suffix(".origin.json").is_file()
    with pytest.raises(ValueError, match="exists already"):
        collect(log, repo=repo)
    unfinished = tmp_path / "unfinished.jsonl"
    unfinished.write_bytes(b"".join(lines[:-1]))
    with pytest.raises(ValueError, match="no session_ended event"):
        collect(unfinished, repo=repo)
