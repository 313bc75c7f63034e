"""`epiforge demo`: the main job on its embedded default, with no API key and no GPU."""

from __future__ import annotations


def run_demo(args) -> int:
    """Evaluate the expert kernel of every task through the CPU emulator."""
    from rich.console import Console
    from rich.table import Table

    import tasks
    from eval import evaluate

    con = Console()
    table = Table(title="epiforge demo: expert kernels, CPU emulator, smoke shapes")
    for col in ("task", "author", "outcome", "worst error / allowed", "seconds"):
        table.add_column(col)
    catalogue, _ = tasks.load_catalogue()
    ok = True
    for task in catalogue:
        r = evaluate(task.name, "human", device="cpu", shapes="smoke")
        ok &= r.passed
        worst = max((c.max_error / c.allowed for s in r.per_shape for c in s.outputs if c.max_error is not None and c.allowed), default=None)
        table.add_row(task.name, r.author or "", r.outcome.value, "" if worst is None else f"{worst:.2f}", f"{r.wall_s:.1f}")
        con.print(f"{task.name}: {r.outcome.value}")
    con.print(table)
    return 0 if ok else 1
