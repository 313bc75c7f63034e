"""On a Hopper GPU: the loop checks a kernel on the GPU as well as the CPU emulator, times it
with run_benchmark, and submit evaluates it on the GPU at the paper's shapes."""

import pytest
from scenarios import K1_GOOD

from epiforge.agent.backends.base import Backend, ModelTurn
from epiforge.agent.loop import run_session
from epiforge.agent.session import Budget, Evaluation, SessionConfig, ToolResult, ToolUseBlock, read_events

pytestmark = pytest.mark.gpu


class Scripted(Backend):
    """Fixed turns, no SDK (the GPU machine has none)."""

    name = "scripted"

    def __init__(self, turns):
        super().__init__("scripted-in-test")
        self.turns = turns

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None):
        return ModelTurn(content=self.turns[step], stop_reason="tool_use")


def test_a_session_checks_times_and_submits_on_the_gpu(tmp_path):
    turns = [
        [ToolUseBlock(id="w", name="write_kernel", input={"source": K1_GOOD}), ToolUseBlock(id="c", name="run_check"),
         ToolUseBlock(id="b", name="run_benchmark", input={"shapes": "smoke"})],
        [ToolUseBlock(id="s", name="submit")],
    ]
    config = SessionConfig(task="k1", backend="scripted", model="scripted-in-test", compile=False, device="auto",
                           budget=Budget(max_turns=3))
    said = []
    end, log = run_session(config, Scripted(turns), log_dir=tmp_path, workspace=tmp_path / "ws", out_dir=tmp_path / "gen",
                           say=said.append)
    events, _ = read_events(log)
    evals = [(e.purpose, e.device, e.shapes, e.outcome) for e in events if isinstance(e, Evaluation)]
    results = {e.call_id: e.content for e in events if isinstance(e, ToolResult)}
    print("\n".join(said), evals, results["b"], results["s"], sep="\n")
    assert end.outcome == "passed", said
    assert ("check", "cuda", "smoke", "PASSED") in evals and ("benchmark", "cuda", "smoke", "PASSED") in evals
    assert ("submit", "cuda", "paper", "PASSED") in evals
    assert "no GPU available" not in results["b"] and "GPU" in results["s"]
