"""The agent can be asked for the task of several GEMMs (issue 15, section 5): its prompt
names the 12 GEMMs and their launches, and a session that writes the expert cut passes it
(tests/tasks/test_layer_task.py: a kernel that leaves a GEMM to torch does not)."""

import json

from loopback import Loopback, Reply

from epiforge import cli as epiforge
from epiforge.eval.machine import REPO

import pytest

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

PRICED = "claude-sonnet-4-5-loopback"
EXPERT = (REPO / "human_kernels" / "layer_non_attention_fwd_bwd.py").read_text()


def _session(capsys, tmp_path, monkeypatch, script):
    monkeypatch.setenv("EPIFORGE_DATA_DIR", str(tmp_path))
    with Loopback("anthropic", script, model=PRICED) as server:
        rc = epiforge.main(["generate", "--task", "layer", "--backend", "anthropic", "--model", PRICED, "--base-url",
                            server.url, "--max-turns", "2", "--json", "--no-compile", "--device", "cpu"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out.strip() else None, err, server.requests


def test_the_agent_writes_the_layer_task(tmp_path, monkeypatch, anthropic_key, capsys):
    source = EXPERT.replace('AUTHOR = "epiforge maintainers"\n', "")
    script = [Reply("the expert cut: k0, k2, k0, k4hf; then k6, k7, k6 and the weight gradients",
                    [("write_kernel", {"source": source}), ("submit", {})])]
    rc, end, err, requests = _session(capsys, tmp_path, monkeypatch, script)
    assert rc == 0 and end["outcome"] == "passed", err
    prompt = json.dumps(requests[0])
    assert "This task runs 12 fused GEMMs" in prompt and "gemm:o_wgrad" in prompt and "rope_backward" in prompt
