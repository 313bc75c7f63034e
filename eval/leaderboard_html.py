"""The leaderboard as one static HTML page (`epiforge leaderboard --html FILE`): the same
tables as the Markdown, and three matplotlib plots embedded as PNG:

  fraction of the speed of light per task and scale, per track
  generated against expert (each task's fraction of the speed of light, one dot per task)
  cost against success (dollars per solved task against pass@1, one dot per backend/model)

A plot with nothing to show says so in its place. The page needs no network.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from epiforge.eval.leaderboard import Board, render_markdown
from epiforge.tasks import id_of, task_order


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _figure(title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return plt, fig, ax


def plot_speed_of_light(board: Board) -> str | None:
    cells = [c for c in board.cells if c.shapes()]
    if not cells:
        return None
    plt, fig, ax = _figure("Fraction of the speed of light (GEMM-only time / kernel time)")
    shapes = []
    for c in cells:
        for s in c.shapes():
            if s.shape not in shapes:
                shapes.append(s.shape)
    # a series per GPU, precision and track: a bar never stands for another GPU's or precision's
    dtypes, gpus = board.dtypes(), board.gpus()
    series = [(gpu, dtype, track) for gpu in gpus for dtype in dtypes for track in board.tracks()]
    labels = sorted({c.task for c in cells}, key=lambda t: task_order(id_of(t)))
    width = 0.8 / max(1, len(series) * len(shapes))
    for ti, (gpu, dtype, track) in enumerate(series):
        name = " ".join([track, *([dtype] if len(dtypes) > 1 else []), *([gpu] if len(gpus) > 1 else [])])
        for si, shape in enumerate(shapes):
            xs, ys = [], []
            for i, task in enumerate(labels):
                c = board.cell(task, track, dtype, gpu)
                t = next((s.timing for s in (c.shapes() if c else []) if s.shape == shape), None)
                if t is not None:
                    xs.append(i + (ti * len(shapes) + si) * width - 0.4 + width / 2)
                    ys.append(t.fraction_of_speed_of_light)
            ax.bar(xs, ys, width=width, label=f"{name} {shape}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), [id_of(t) for t in labels])
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7, ncol=3)
    out = _png(fig)
    plt.close(fig)
    return out


def plot_generated_vs_expert(board: Board) -> str | None:
    pairs = []
    for track in board.tracks():
        if not track.startswith("generated"):
            continue
        for c in board.cells:
            expert = board.cell(c.task, "expert", c.dtype, c.gpu)
            if c.track == track and expert is not None:
                name = id_of(c.task) + ("" if c.dtype == "bfloat16" else f" {c.dtype}") + (
                    f" {c.gpu}" if len(board.gpus()) > 1 else "")
                pairs.append((1 / expert.worst_over_sol, 1 / c.worst_over_sol, name, track))
    if not pairs:
        return None
    plt, fig, ax = _figure("Generated against expert (worst fraction of the speed of light per task)")
    for x, y, name, track in pairs:
        ax.scatter([x], [y])
        ax.annotate(name, (x, y), fontsize=8)
    ax.plot([0, 1.05], [0, 1.05], color="black", linewidth=0.8)
    ax.set_xlabel("expert")
    ax.set_ylabel("generated")
    out = _png(fig)
    plt.close(fig)
    return out


def plot_cost_vs_success(board: Board) -> str | None:
    dots = [(a.usd / a.solved, a.pass_at(1), f"{a.backend}/{a.model}") for a in board.agents
            if a.solved and a.usd is not None and a.pass_at(1) is not None]
    if not dots:
        return None
    plt, fig, ax = _figure("Cost against success (per backend and model)")
    for x, y, name in dots:
        ax.scatter([x], [y])
        ax.annotate(name, (x, y), fontsize=8)
    ax.set_xlabel("dollars per solved task")
    ax.set_ylabel("pass@1")
    ax.set_ylim(0, 1.05)
    out = _png(fig)
    plt.close(fig)
    return out


def write_html(board: Board, path: Path) -> None:
    plots = [("Fraction of the speed of light", plot_speed_of_light(board)),
             ("Generated against expert", plot_generated_vs_expert(board)),
             ("Cost against success", plot_cost_vs_success(board))]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>epiforge leaderboard</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}"
             "pre{white-space:pre-wrap}img{max-width:100%}</style></head><body>"]
    for title, png in plots:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if png is None:
            parts.append("<p class='empty'>Nothing to plot yet: no results of this kind.</p>")
        else:
            parts.append(f"<img class='plot' alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Tables</h2>")
    parts.append(_markdown_to_html(render_markdown(board)))
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))


def _markdown_to_html(text: str) -> str:
    """The Markdown this module's sibling writes (headings, pipe tables, lines) as HTML."""
    out, table = [], []

    def flush():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[html.escape(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
            out.append("<table>" + "".join(
                "<tr>" + "".join(f"<{'th' if i == 0 else 'td'}>{c}</{'th' if i == 0 else 'td'}>" for c in row) + "</tr>"
                for i, row in enumerate(cells)) + "</table>")
            table.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level + 1}>{html.escape(line.lstrip('# '))}</h{level + 1}>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)
