"""Which tile config each shipped generated kernel runs at each paper shape, beside the
expert's, and where its table came from: read from the kernels' source (their TUNED tables,
by ast.literal_eval), never by importing them (generated code is hostile until proven
otherwise, and nothing here needs it run).

    python -m lab.generated_configs [--shapes paper] [--backend command] [--json FILE] [--markdown FILE]

For each task with kernels under generated_kernels/ and each kernel there of the backend
(command: the real LLM sessions; "any" for all, the scripted replay too):
- its config at each shape's GEMM (primitives.config.pick_config on the literal table: the
  shape's own entry, else the nearest measured shape's, else the default);
- the expert's config there (human_kernels/<task>.py, the same way), and whether they agree;
- where the generated table came from: "own" when no expert table of another task holds the
  same entries, else the other tasks whose expert tables hold every one of its entries
  (the agents saw those tables in their examples), "none" for a kernel without a table (the
  default config everywhere), "not a literal" for a table ast cannot read.

A generated kernel that picks another config than the expert's at a shape is timed there
with a different mainloop: its time / expert's then measures the table, not the epilogue.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from epiforge import ROOT as REPO
from epiforge.primitives.config import DEFAULT_CONFIG, pick_config
from epiforge.tasks import get_task, load_shape_sets

GENERATED = REPO / "generated_kernels"
EXPERTS = REPO / "human_kernels"


def literal_table(path: Path) -> dict | str | None:
    """The module-level TUNED of a kernel's source: a dict, "not a literal", or None (no TUNED)."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "TUNED" for t in targets) and node.value is not None:
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return "not a literal"
            return table if isinstance(table, dict) else "not a literal"
    return None


def config_at(table: dict | str | None, mnk: tuple[int, int, int]) -> str:
    """The config a kernel with this table picks for a GEMM of m x n x k."""
    if not isinstance(table, dict):
        return DEFAULT_CONFIG.key() if table is None else "?"
    m, n, k = mnk
    return pick_config(table, SimpleNamespace(shape=(m, k)), SimpleNamespace(shape=(n, k))).key()


def table_source(table: dict | str | None, task_name: str, experts: dict[str, dict]) -> str:
    """Where a generated table's entries came from (module docstring)."""
    if table is None:
        return "none"
    if not isinstance(table, dict):
        return table
    if not table:
        return "empty"
    donors = [name for name, other in experts.items() if name != task_name
              and all(other.get(key) == cfg for key, cfg in table.items())]
    return "own" if not donors else "the expert table of " + ", ".join(donors)


def study(shape_set: str = "paper", backend: str = "command") -> list[dict]:
    sets = load_shape_sets()[shape_set]
    experts = {p.stem: t for p in sorted(EXPERTS.glob("*.py"))
               if isinstance(t := literal_table(p), dict)}
    rows = []
    for folder in sorted(p for p in GENERATED.iterdir() if p.is_dir()):
        task = get_task(folder.name)
        if task.gemm_count != 1:
            continue  # a task of several GEMMs picks per GEMM role: not read here
        expert_path = EXPERTS / f"{folder.name}.py"
        expert = literal_table(expert_path) if expert_path.is_file() else None
        for kernel in sorted(folder.glob("*.py")):
            table = literal_table(kernel)
            origin = json.loads(kernel.with_suffix(".origin.json").read_text()) \
                if kernel.with_suffix(".origin.json").is_file() else {}
            if backend != "any" and origin.get("backend") != backend:
                continue
            shapes = []
            for shape in sets:
                mnk = task.gemm_shape(shape.dims())
                mine = config_at(table, mnk)
                theirs = config_at(expert, mnk) if expert_path.is_file() else None
                shapes.append({"shape": shape.name, "gemm": "x".join(map(str, mnk)), "config": mine,
                               "expert_config": theirs, "same": theirs is not None and mine == theirs})
            rows.append({"task": folder.name, "kernel": kernel.relative_to(REPO).as_posix(),
                         "session": origin.get("session", kernel.stem),
                         "table": table_source(table, folder.name, experts), "shapes": shapes})
    return rows


def markdown(rows: list[dict]) -> str:
    names = [s["shape"] for s in rows[0]["shapes"]] if rows else []
    out = ["| task | session | its table | " + " | ".join(f"{n}: config (expert's)" for n in names) + " |",
           "|---|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = [f"{s['config']} (same)" if s["same"] else
                 f"{s['config']} ({s['expert_config'] or 'no expert'})" for s in r["shapes"]]
        out.append(f"| {r['task']} | {r['session']} | {r['table']} | " + " | ".join(cells) + " |")
    n = sum(len(r["shapes"]) for r in rows if r["shapes"][0]["expert_config"] is not None)
    same = sum(s["same"] for r in rows for s in r["shapes"])
    out.append(f"\n{same} of {n} (kernel, shape) pairs of tasks with an expert run the expert's config.")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="paper")
    ap.add_argument("--backend", default="command", help="the kernels of this backend (any: all)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    rows = study(args.shapes, args.backend)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    text = markdown(rows)
    if args.markdown:
        args.markdown.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
