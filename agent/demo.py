"""`epiforge demo`: the main job on its embedded default, with no API key and no GPU.

It replays the example session shipped in logs/examples/ offline: the recorded model
responses drive the real loop, and every kernel the session wrote is re-evaluated here on
the CPU (emulator numerics and the sm_90a cross-compile), so the demo shows the agent
loop, its feedback and the evaluator at work, and whether this machine reproduces the
recorded verdicts (the replay's log goes to the data directory's replays/, as
`epiforge replay`'s does; nothing is written into the repository). `--experts` also evaluates every task's expert kernel. It ends with the
leaderboard of the H200 results shipped in eval/data (`epiforge leaderboard`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from epiforge.eval.kernel import REPO

EXAMPLES = REPO / "logs" / "examples"
DEFAULT_EXAMPLE = "k8_gemm_swiglu.anthropic.scripted-loopback.jsonl"


def run_demo(args) -> int:
    from epiforge.agent.cli import print_replay
    from epiforge.agent.loop import data_path
    from epiforge.agent.replay import replay
    from epiforge.agent.session import read_events

    log = Path(getattr(args, "log", None) or EXAMPLES / DEFAULT_EXAMPLE)
    start = read_events(log)[0][0]
    print(f"epiforge demo: replaying {log.name}, a {start.config.task} session recorded with the "
          f"{start.config.backend} backend (model: {start.config.model}).")
    print("The recorded responses drive the loop offline; every kernel is re-evaluated on this machine.\n")
    with tempfile.TemporaryDirectory(prefix="epiforge-demo-") as tmp:
        # the replay's own log stays in the data directory's replays/ for a look (nothing is
        # written into the repository); its workspace does not
        report = replay(log, log_dir=data_path("replays"), workspace=Path(tmp))
        print()
        print_replay(report)
    ok = report.reproduced
    if getattr(args, "experts", False):
        ok &= _experts()
    _leaderboard()
    return 0 if ok else 1


def _leaderboard() -> None:
    """The last thing the demo shows: the leaderboard of the results and agent sessions shipped in the repo."""
    from epiforge.eval import leaderboard as lb

    shipped = lb.load_shipped()
    board = lb.build(shipped, lb.agent_rows([lb.SHIPPED_SESSIONS]),
                     sources=[*lb.describe_shipped(), lb.SHIPPED_SESSIONS_SOURCE])
    print()
    print(lb.render_markdown(board), end="")


def _experts() -> bool:
    from epiforge.cli import console
    from rich.table import Table

    from epiforge import tasks
    from epiforge.eval import evaluate

    con = console()
    table = Table(title="expert kernels, CPU emulator, smoke shapes")
    for col in ("task", "author", "outcome", "worst error / allowed", "seconds"):
        table.add_column(col)
    from epiforge.eval.machine import expert_kernel

    catalogue, _ = tasks.load_catalogue()
    ok = True
    for task in [t for t in catalogue if expert_kernel(t.name)]:  # a task may have no expert kernel
        r = evaluate(task.name, "human", device="cpu", shapes="smoke")
        ok &= r.passed
        worst = max((c.max_error / c.allowed for s in r.per_shape for c in s.outputs if c.max_error is not None and c.allowed), default=None)
        table.add_row(task.name, r.author or "", r.outcome.value, "" if worst is None else f"{worst:.2f}", f"{r.wall_s:.1f}")
    con.print(table)
    return ok
