"""The best measured config of each expert kernel per GEMM shape, from lab/bench/run.py result
files, as the TUNED table a kernel file carries (so a rerun does not retune: the kernel
picks its config itself with primitives.pick_config); likewise for the quack library
alternatives (eval/quack_library.py). Only sweeps timed in one interleaved run compare
configs fairly: pass those.

    python -m lab.bench.tuning lab/results/h200/sweep.json [--write]
    python -m lab.bench.tuning lab/results/h200/sweep*.json lab/results/h200/confirm.json --check
    python -m lab.bench.tuning lab/results/h200/c-load-warp.json --pairs _cl    (a flag against its twin)
    python -m lab.bench.tuning h200/sweep-llama3/*.json --picks --other h100/sweep-llama3/*.json
        (each shape's TUNED pick against the fastest config, here and on another card)
"""

from __future__ import annotations

import argparse
import ast
import re
import statistics
import sys
import textwrap
from pathlib import Path
from epiforge.eval.machine import REPO



def config_ratios(files: list[str], what: str = "fused") -> dict[str, dict[str, dict[str, float]]]:
    """{task: {"MxNxK": {config key: time / GEMM-only}}}, each ratio within one sweep (one
    interleaved run; eval.stats.speed); a later file's row for the same task and shape
    replaces an earlier one's (ratios from different runs are not compared)."""
    from lab.bench.rows import BenchReport, load_report
    from epiforge.eval.stats import speed

    rows = {}
    for f in files:
        for row in load_report(f, BenchReport).rows:
            rows[row.task, row.shape] = row
    out: dict[str, dict[str, dict[str, float]]] = {}
    for row in rows.values():
        quack = [c.gemm_quack for c in row.configs.values() if c.gemm_quack is not None]
        if not quack:
            continue
        ref = row.gemm_cublas  # every time is taken against it, repetition by repetition (eval.stats.speed)
        best_gemm = row.gemm_quack_best  # a confirmation run's speed-of-light configs
        gemm_only = min(speed(t, ref) for t in [ref, *quack, *([best_gemm] if best_gemm else [])])
        shape = "x".join(str(x) for x in row.gemm_mnk)
        for key, c in row.configs.items():
            if c.get(what) is not None:
                # the library may have run at its own config beside the fused kernel's (--configs-from)
                cfg = c.quack_library_config or key if what == "quack_library" else key
                out.setdefault(row.task, {}).setdefault(shape, {})[cfg] = speed(c.get(what), ref) / gemm_only
    return out


def best_configs(files: list[str], what: str = "fused") -> dict[str, dict[str, tuple[str, float]]]:
    """{task: {"MxNxK": (config key, time / GEMM-only)}}: per task and shape the config with
    the lowest ratio (config_ratios)."""
    return {task: {shape: min(cfgs.items(), key=lambda kv: kv[1]) for shape, cfgs in shapes.items()}
            for task, shapes in config_ratios(files, what).items()}


def flag_pairs(files: list[str], suffix: str) -> list[tuple[str, str, str, list[float | None]]]:
    """(task, shape, twin config, [per file: the flagged config's time / its twin's]) for
    every config key holding `suffix` (a flag's key part, e.g. "_cl", or "_en64" before a
    "_cl") whose twin without it ran in the same row: the median of per-repetition ratios within one interleaved run
    (eval.stats.paired_ratio), None where a file lacks the pair or their samples."""
    from lab.bench.rows import BenchReport, load_report
    from epiforge.eval.stats import paired_ratio

    reports = [{(r.task, r.shape): r for r in load_report(f, BenchReport).rows} for f in files]
    out = []
    for (task, shape), row in reports[0].items():
        for key in row.configs:
            if not (key.endswith(suffix) or f"{suffix}_" in key):
                continue
            twin, ratios = key.replace(suffix, "", 1), []
            for rows in reports:
                r = rows.get((task, shape))
                a = r and r.configs.get(key) and r.configs[key].fused
                b = r and r.configs.get(twin) and r.configs[twin].fused
                ok = a and b and a.samples_us and len(a.samples_us) == len(b.samples_us)
                ratios.append(paired_ratio(a, b).median if ok else None)
            out.append((task, shape, twin, ratios))
    return out


#: a kernel file's TUNED table, from `TUNED = {` to the closing brace at the line's start
_KERNEL_TABLE = re.compile(r"^TUNED = (\{.*?^\})", flags=re.S | re.M)


def current_table(path: Path) -> dict[str, str]:
    """The TUNED table a kernel file carries now, read as data (the file is not imported)."""
    m = _KERNEL_TABLE.search(path.read_text())
    if not m:
        raise SystemExit(f"{path}: no TUNED table")
    return ast.literal_eval(m.group(1))


def check(files: list[str]) -> list[str]:
    """Where the kernels' TUNED tables differ from what these files pick: a line each, with
    how much faster the pick ran than the table's config in the same run, and a summary."""
    lines, margins, n = [], [], 0
    for task, shapes in sorted(config_ratios(files).items()):
        table_now = current_table(REPO / "human_kernels" / f"{task}.py")
        for shape, cfgs in sorted(shapes.items()):
            n += 1
            pick = min(cfgs, key=cfgs.get)
            have = table_now.get(shape)
            if have == pick:
                continue
            if have in cfgs:
                margins.append(cfgs[have] / cfgs[pick] - 1)
                lines.append(f"{task} {shape}: TUNED {have}, these files pick {pick}, {margins[-1]:.2%} faster")
            else:
                lines.append(f"{task} {shape}: TUNED {have}, not timed in these files; they pick {pick}")
    summary = f"{len(lines)} of {n} entries differ"
    if margins:
        summary += f"; the picks ran at most {max(margins):.2%} faster (median {statistics.median(margins):.2%})"
    return lines + [summary]


def tuned_picks(files: list[str], other: list[str] | None = None,
                kernels_dir: Path | None = None) -> list[tuple[str, str, str, bool, float | None, str, float,
                                                               float | None, float | None]]:
    """Per task and shape of these files: (task, shape, the config the kernel's TUNED table
    gives that shape through primitives.pick_config, whether the shape has its own entry,
    that config's time / GEMM-only here, the fastest config here, its ratio, then the pick's
    and the fastest config's ratios in the other files (a sweep of the same shapes on another
    card; None where not timed there)). Ratios within one run only (config_ratios)."""
    import torch

    from epiforge.primitives.config import pick_config

    kernels_dir = kernels_dir or REPO / "human_kernels"
    there = config_ratios(other) if other else {}
    rows = []
    for task, shapes in sorted(config_ratios(files).items()):
        table_now = current_table(kernels_dir / f"{task}.py")
        for shape, cfgs in sorted(shapes.items(), key=lambda kv: [int(x) for x in kv[0].split("x")]):
            m, n, k = (int(x) for x in shape.split("x"))
            pick = pick_config(table_now, torch.empty(m, k, device="meta"), torch.empty(n, k, device="meta")).key()
            best = min(cfgs, key=cfgs.get)
            far = there.get(task, {}).get(shape, {})
            rows.append((task, shape, pick, shape in table_now, cfgs.get(pick), best, cfgs[best],
                         far.get(pick), far.get(best)))
    return rows


def picks_table(rows, other: bool) -> str:
    """tuned_picks as Markdown."""
    f = lambda r: "-" if r is None else f"{r:.3f}"  # noqa: E731
    cols = ["task", "m x n x k", "TUNED pick", "pick here", "fastest here",
            *(["pick there", "fastest here's config there"] if other else [])]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for task, shape, pick, own, here, best, best_r, pick_there, best_there in rows:
        cells = [task, shape.replace("x", " x "), pick + ("" if own else " (nearest entry)"), f(here),
                 f"{best_r:.3f} ({best})"] + ([f(pick_there), f(best_there)] if other else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(shapes: dict[str, tuple[str, float]], indent: str = "") -> str:
    lines = ["{"]
    for shape, (cfg, ratio) in sorted(shapes.items(), key=lambda kv: int(kv[0].split("x")[1])):
        lines.append(f'{indent}    "{shape}": "{cfg}",  # {ratio:.3f} of GEMM-only')
    return "\n".join(lines) + f"\n{indent}}}"


def provenance(files: list[str]) -> str:
    """The comment above a written TUNED table: which sweeps it came from (wrapped)."""
    names = textwrap.wrap(" ".join(Path(f).as_posix() for f in files), 90, break_on_hyphens=False)
    return "\n".join(["# measured best tile configs on the H200 by GEMM m x n x k, written by",
                      "# python -m lab.bench.tuning --write from:", *(f"#   {line}" for line in names)])


def _stamp(src: str, files: list[str] | None) -> str:
    """Rewrite the provenance comment right above `TUNED = {` (when files are given)."""
    if not files:
        return src
    return re.sub(r"^# measured best tile configs[^\n]*\n(?:#[^\n]*\n)*?(?=TUNED = \{)",
                  lambda _: provenance(files) + "\n", src, count=1, flags=re.M)


def write_kernel_table(path: Path, shapes, files: list[str] | None = None) -> None:
    src = path.read_text()
    new, n = _KERNEL_TABLE.subn(lambda _: "TUNED = " + table(shapes), src, count=1)
    if n != 1:
        raise SystemExit(f"{path}: no TUNED table to replace")
    path.write_text(_stamp(new, files))


def write_library_table(path: Path, task: str, shapes, files: list[str] | None = None) -> None:
    src = path.read_text()
    pattern = rf'^    "{task}": \{{.*?^    \}}|^    "{task}": \{{\}}'
    new, n = re.subn(pattern, lambda _: f'    "{task}": ' + table(shapes, "    "), src, count=1, flags=re.S | re.M)
    if n != 1:
        raise SystemExit(f"{path}: no TUNED entry for {task}")
    path.write_text(_stamp(new, files))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--write", action="store_true", help="rewrite the TUNED tables in human_kernels/ and eval/quack_library.py")
    ap.add_argument("--check", action="store_true",
                    help="only say where the kernels' TUNED tables differ from these files' picks, and by how much")
    ap.add_argument("--ratios", action="store_true", help="only list every config's time / GEMM-only, fastest first")
    ap.add_argument("--of", default="fused", metavar="WHAT",
                    help="with --ratios: whose time, 'fused' (default), 'quack_library' or 'diag:<diagnostic>' "
                         "(e.g. diag:without_zdz, from files made with --diagnostics)")
    ap.add_argument("--pairs", metavar="SUFFIX", default=None,
                    help="only list, per row, each config whose key ends in SUFFIX (a flag, e.g. _cl) over its "
                         "twin without it, per repetition, one column per file (Markdown)")
    ap.add_argument("--picks", action="store_true",
                    help="only list, per shape, the config the TUNED table gives it against the fastest config "
                         "in these files (Markdown)")
    ap.add_argument("--other", nargs="+", metavar="FILE", default=None,
                    help="with --picks: the same sweep on another card, whose ratios of both configs are added")
    args = ap.parse_args(argv)
    if args.write + args.check + args.ratios + (args.pairs is not None) + args.picks > 1:
        ap.error("pass one of --write, --check, --ratios, --pairs, --picks")
    if args.other and not args.picks:
        ap.error("--other goes with --picks")
    if args.of != "fused" and not args.ratios:
        ap.error("--of goes with --ratios")
    if args.of not in ("fused", "quack_library") and not (args.of.startswith("diag:") and len(args.of) > 5):
        ap.error(f"--of {args.of}: use fused, quack_library or diag:<diagnostic>")
    if args.pairs is not None:
        try:
            pairs = flag_pairs(args.files, args.pairs)
        except ValueError as e:
            ap.error(str(e))
        if not pairs:
            ap.error(f"--pairs {args.pairs}: no config key holds it in {args.files[0]}")
        print(f"| task | shape | config | " + " | ".join(f"{args.pairs} / without, {Path(f).name}" for f in args.files)
              + " |\n|---|---|---|" + "---|" * len(args.files))
        for task, shape, twin, ratios in pairs:
            print(f"| {task} | {shape} | {twin} | " + " | ".join("-" if r is None else f"{r:.3f}" for r in ratios) + " |")
        return 0
    try:
        fused, library = best_configs(args.files), best_configs(args.files, "quack_library")
    except ValueError as e:
        ap.error(str(e))
    if args.check:
        print("\n".join(check(args.files)))
        return 0
    if args.picks:
        try:
            print(picks_table(tuned_picks(args.files, args.other), other=bool(args.other)))
        except (ValueError, OSError) as e:
            ap.error(str(e).splitlines()[0])
        return 0
    if args.ratios:
        ratios = config_ratios(args.files, args.of)
        if not ratios:
            ap.error(f"no {args.of} timings in {' '.join(args.files)}")
        for task, shapes in sorted(ratios.items()):
            for shape, cfgs in sorted(shapes.items(), key=lambda kv: int(kv[0].split("x")[1])):
                print(f"{task} {shape}: " + ", ".join(f"{c} {r:.3f}" for c, r in sorted(cfgs.items(), key=lambda kv: kv[1])))
        return 0
    for task, shapes in sorted(fused.items()):
        print(f"# {task}\nTUNED = {table(shapes)}")
        if args.write:
            write_kernel_table(REPO / "human_kernels" / f"{task}.py", shapes, args.files)
    for task, shapes in sorted(library.items()):
        print(f"# quack library for {task}\n{table(shapes)}")
        if args.write:
            write_library_table(REPO / "eval" / "quack_library.py", task, shapes, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
