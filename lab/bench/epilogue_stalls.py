"""Where the epilogue warps wait, instruction by instruction (issue 16): Nsight Compute's PC
sampling of a kernel built with line info, each sampled SASS instruction given the role of
the quack (or primitives/) source line it came from.

    python -m lab.bench.epilogue_stalls lab/results/h100/stalls/epilogue-stalls.txt.gz \\
        --out lab/results/h100/stalls/epilogue-stalls.json --md lab/results/h100/stalls/epilogue-stalls.md

The input is `lab/bench/h200.sh profile-epilogue-stalls`' file: per run ("==> k7-1B-<config> <=="),
the source page of one profiled launch as CSV (address, SASS, samples per stall reason). The
kernel-wide averages of `profile-stalls` cannot tell the epilogue warps from the others;
this can:
- each run's instructions are matched, by their text, to the object they came from
  (bench.precompile --lineinfo, LINEINFO_CACHE_DIR), and nvdisasm -g (bench.sass) names each
  instruction's source file and line;
- the function around that line gives the role (`role_of`): the epilogue, the mainloop, the A/B
  loads, the C-load warp, the tile scheduler, the kernel's own lines. Helpers shared by all
  (quack/pipeline.py, copy_utils, fast_math, CuTe's own code, no line) take the role of the
  code they are inlined into: the instruction before them, or, for a wait's out-of-line
  retry loop after the kernel's EXIT, the wait it retries;
- per role: samples, share, the stall reasons; for the epilogue, its barrier waits (SYNCS
  try-waits, the branch on each one's predicate where its latency is sampled, and their
  retry loops: the C loads' full barriers among them) apart from the rest.
Samples are counts of the sampled warps' states, so a role's share is its share of warp time
(all warps, idle producer warps included), not of the kernel's duration.
"""

from __future__ import annotations

import argparse
import ast
import csv
import gzip
import io
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

from lab.bench.configs import LINEINFO_CACHE_DIR
from epiforge.eval.machine import REPO

#: partitioning and set-up helpers that more than one warp role calls
PARTITIONS = ("epilog_gmem_copy_and_partition", "epilog_smem_load_and_partition", "epilog_smem_store_and_partition",
              "make_ab_pipeline")
#: helpers every warp role inlines: their instructions take the role of the code around them
SHARED = ("quack/pipeline.py", "quack/copy_utils.py", "quack/fast_math.py", "quack/utils.py", "quack/layout_utils.py")


def role_of(file: str, function: str) -> str | None:
    """The warp role a source line's function belongs to; None for a helper every role shares."""
    if file.startswith("primitives/c_load_warp"):
        return "C-load warp"
    if file.startswith(("quack/epilogue/", "quack/activation.py", "quack/reduce.py", "primitives/")):
        return "epilogue"
    if file.startswith(SHARED) or file.startswith("cutlass/") or function in ("", "<module>", "?"):
        return None
    name = function.rsplit(".", 1)[-1]
    if name in PARTITIONS:
        return None
    if name == "epilogue" or name.startswith(("epi_", "epilog_")):
        return "epilogue"
    if name.startswith("pingpong_barrier"):
        return "pingpong barrier"
    if name in ("mma", "gemm", "gemm_w_idx", "partition_fragment_ABC") or file == "quack/sm90_utils.py":
        return "mainloop"
    if name == "load_tma" or "load_AB" in name:
        return "A/B loads"
    if file == "quack/tile_scheduler.py":
        return "tile scheduler"
    return "kernel"


# --- the objects' SASS, with lines ------------------------------------------------------------

_INSTR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def short_path(path: str) -> str:
    """A source path without the machine's part: quack/..., primitives/..., or the name of
    the generated kernel source (primitives' text edits of quack's kernel)."""
    p = path.replace("\\", "/")
    if "/site-packages/" in p:
        return p.split("/site-packages/", 1)[1]
    repo = str(REPO).replace("\\", "/") + "/"
    if p.startswith(repo):
        return p[len(repo):]
    if "/generated/quack_gemm_sm90_kernel" in p:
        return "generated/" + p.rsplit("/", 1)[1]  # GemmSm90.kernel with primitives' edits
    return Path(p).name


_FUNCTIONS: dict[str, list[tuple[int, int, str]]] = {}


def function_at(path: str, line: int) -> str:
    """The qualified name of the innermost function around a line of a Python file ('?' if
    the file is not on this machine)."""
    if path not in _FUNCTIONS:
        spans: list[tuple[int, int, str]] = []
        try:
            tree = ast.parse(Path(path).read_text())
        except (OSError, SyntaxError, ValueError):
            tree = None

        def walk(node, prefix):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    if not isinstance(child, ast.ClassDef):
                        spans.append((child.lineno, child.end_lineno or child.lineno, name))
                    walk(child, name + ".")
                else:
                    walk(child, prefix)

        if tree is not None:
            walk(tree, "")
        _FUNCTIONS[path] = spans if tree is not None else None
    spans = _FUNCTIONS[path]
    if spans is None:
        return "?"
    inside = [(a, name) for a, b, name in spans if a <= line <= b]
    if path.rsplit("/", 1)[-1].startswith("quack_gemm_sm90_kernel") and not inside:
        return "GemmSm90.kernel"
    return max(inside)[1] if inside else "<module>"


def annotated_sass(sass: str) -> list[dict]:
    """Each instruction of nvdisasm -g's text: offset, text, source file and line, function,
    role (helpers resolved: see the module docstring)."""
    rows, labels, where, label_here = [], {}, None, []
    for text in sass.splitlines():
        if m := _LINE.search(text):
            path, line = m.group(1), int(m.group(2))
            where = (short_path(path), line, function_at(path, line))
        elif m := _LABEL.match(text):
            label_here.append(m.group(1))
        elif m := _INSTR.match(text):
            file, line, function = where or ("", 0, "")
            rows.append({"offset": int(m.group(1), 16), "sass": m.group(2), "file": file, "line": line,
                         "function": function, "role": role_of(file, function)})
            for label in label_here:
                labels[label] = len(rows) - 1
            label_here = []
    # the retry loops of waits sit after the kernel's last EXIT: each such block takes the role
    # of the code its final branch returns to
    last_exit = max((i for i, r in enumerate(rows) if re.match(r"(@!?U?P\w+\s+)?EXIT\b", r["sass"])), default=len(rows))
    start = last_exit + 1
    while start < len(rows):
        end = start
        while end < len(rows) and not re.match(r"BRA\b", rows[end]["sass"]):
            end += 1
        target = _TARGET.search(rows[end]["sass"]) if end < len(rows) else None
        back = labels.get(target.group(1)) if target else None
        for r in rows[start:end + 1]:
            r["tail_of"] = back
        start = end + 1
    # helpers inherit the role of the code before them; a retry loop that of the wait it
    # retries (the instruction before the one its branch returns to)
    role = "kernel"
    for r in rows[:last_exit + 1]:
        r["role"] = r["role"] or role
        role = r["role"]
    for r in rows[last_exit + 1:]:
        back = r.get("tail_of")
        r["role"] = rows[back - 1]["role"] if back else (r["role"] or "kernel")
    return rows


def objects_sass(folder: Path) -> dict[str, list[dict]]:
    """{object name: annotated instructions} for every object under folder."""
    from lab.bench.sass import sass_of

    return {obj.stem: annotated_sass(sass_of(obj, line_info=True)) for obj in sorted(Path(folder).glob("*/*.o"))}


# --- the profile ----------------------------------------------------------------------------

#: the source page's column of all warp-state samples at an instruction
SAMPLES = "Warp Stall Sampling (All Samples)"
_HEX = re.compile(r"0x[0-9a-fA-F]+")


def read_runs(text: str) -> dict[str, list[dict]]:
    """{run name: source-page rows} of profile-epilogue-stalls' file: the blocks with an
    address, source and samples column, their rows with a hex address (the details blocks
    and anything else skipped)."""
    runs, name, lines = {}, None, []

    def close():
        if name and lines:
            reader = csv.reader(io.StringIO("\n".join(lines)))
            rows = [r for r in reader if r]
            head = next((i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"]), None)
            if head is not None and SAMPLES in rows[head]:
                cols = rows[head]
                kept = [dict(zip(cols, r)) for r in rows[head + 1:] if len(r) == len(cols) and _HEX.fullmatch(r[0])]
                if kept:
                    runs[name] = kept

    for line in text.splitlines():
        if m := re.match(r"==> (.+?) <==$", line):
            close()
            name, lines = (None if m.group(1).endswith(" details") else m.group(1)), []
        elif name:
            lines.append(line)
    close()
    return runs


def _opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass.strip()).split(" ", 1)[0]


def match_object(rows: list[dict], objects: dict[str, list[dict]]) -> tuple[str, list[dict], float]:
    """The object whose instructions these profile rows are: offsets from the first row's
    address, the most opcodes alike."""
    base = int(rows[0]["Address"], 16)
    best = ("", [], 0.0)
    for name, sass in objects.items():
        by_offset = {r["offset"]: r for r in sass}
        same = sum(1 for r in rows if (s := by_offset.get(int(r["Address"], 16) - base))
                   and _opcode(s["sass"]) == _opcode(r["Source"]))
        score = same / max(len(rows), len(sass))
        if score > best[2]:
            best = (name, sass, score)
    return best


#: how many instructions after a try-wait the branch on its predicate may come
WAIT_WINDOW = 64


def _count(value: str) -> int:
    try:
        return int(float(value))
    except ValueError:
        return 0


def summarize(name: str, rows: list[dict], obj: str, sass: list[dict], score: float, top: int = 12) -> dict:
    """One run: samples by role and reason; the epilogue's waits apart; its top instructions."""
    base = int(rows[0]["Address"], 16)
    by_offset = {r["offset"]: r for r in sass}
    reasons = [c for c in rows[0] if c.startswith("stall_") and not c.endswith("(Not Issued)")]
    roles: dict[str, Counter] = defaultdict(Counter)
    total, epi_waits, epi_bars = 0, Counter(), Counter()
    instrs, pending = [], {}  # pending: predicate of a try-wait -> rows left to find its branch in
    for r in rows:
        s = by_offset.get(int(r["Address"], 16) - base)
        op = _opcode(r["Source"])
        # a try-wait, the branch on its predicate that follows it (scheduled up to a few dozen
        # instructions later; where its latency is sampled) and its retry loop after EXIT are one wait
        branch = re.match(r"@!(U?P\d+)\s+BRA\b", r["Source"].strip())
        is_wait = op.startswith(("SYNCS.PHASECHK", "NANOSLEEP")) or bool(s and s.get("tail_of") is not None) \
            or bool(branch and pending.pop(branch.group(1), 0) > 0)
        pending = {k: v - 1 for k, v in pending.items() if v > 1}
        if m := re.search(r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT\s+(U?P\d+)", r["Source"]):
            pending[m.group(1)] = WAIT_WINDOW
        role = s["role"] if s else "unmatched"
        n = _count(r[SAMPLES])
        total += n
        roles[role]["samples"] += n
        for reason in reasons:
            roles[role][reason] += _count(r[reason])
        if role == "epilogue" and is_wait:
            epi_waits["samples"] += n
            for reason in reasons:
                epi_waits[reason] += _count(r[reason])
        elif role == "epilogue" and op.startswith("BAR"):
            epi_bars["samples"] += n
        if n:
            instrs.append({"offset": hex(int(r["Address"], 16) - base), "sass": r["Source"].strip(), "samples": n,
                           "role": role, "wait": is_wait, "source": f"{s['file']}:{s['line']}" if s and s["file"] else "",
                           "function": s["function"] if s else "",
                           "reasons": {k.removeprefix("stall_"): _count(r[k]) for k in reasons if _count(r[k])}})
    lines: dict[str, Counter] = defaultdict(Counter)
    for i in instrs:
        if i["role"] == "epilogue":
            lines[f"{i['source']} ({i['function']})"]["samples"] += i["samples"]
            lines[f"{i['source']} ({i['function']})"].update(i["reasons"])
    epi_lines = [{"source": k, "samples": c["samples"], "reasons": {r: v for r, v in c.most_common() if r != "samples"}}
                 for k, c in sorted(lines.items(), key=lambda kv: -kv[1]["samples"])[:top]]
    out_roles = {}
    for role, c in sorted(roles.items(), key=lambda kv: -kv[1]["samples"]):
        out_roles[role] = {"samples": c["samples"], "share": c["samples"] / total if total else 0.0,
                           "reasons": {k.removeprefix("stall_"): v for k, v in c.most_common() if k != "samples" and v}}
    epi = roles.get("epilogue", Counter())["samples"]
    return {
        "run": name, "object": obj, "matched": score, "samples": total, "roles": out_roles,
        "epilogue_waits": {"samples": epi_waits["samples"], "share_of_epilogue": epi_waits["samples"] / epi if epi else 0.0,
                           "share_of_all": epi_waits["samples"] / total if total else 0.0,
                           "reasons": {k.removeprefix("stall_"): v for k, v in epi_waits.most_common() if k != "samples" and v}},
        "epilogue_named_barriers": {"samples": epi_bars["samples"], "share_of_epilogue": epi_bars["samples"] / epi if epi else 0.0},
        "top_epilogue_lines": epi_lines,
        "top_epilogue_instructions": sorted((i for i in instrs if i["role"] == "epilogue"), key=lambda i: -i["samples"])[:top],
        "top_instructions": sorted(instrs, key=lambda i: -i["samples"])[:top],
    }


def markdown(runs: list[dict]) -> str:
    roles = ["epilogue", "mainloop", "A/B loads", "C-load warp", "tile scheduler", "pingpong barrier", "kernel"]
    lines = ["| run | samples | " + " | ".join(roles) + " | epilogue waits / epilogue | their top reasons |",
             "|---|---|" + "---|" * len(roles) + "---|---|"]
    for r in runs:
        share = [f"{r['roles'].get(k, {}).get('share', 0.0):.3f}" for k in roles]
        w = r["epilogue_waits"]
        why = ", ".join(f"{k} {v}" for k, v in list(w["reasons"].items())[:3])
        lines.append(f"| {r['run']} | {r['samples']} | " + " | ".join(share) + f" | {w['share_of_epilogue']:.3f} | {why} |")
    lines.append("")
    lines.append("Shares of all warp-state samples (every warp, idle ones included). Epilogue waits: the epilogue's")
    lines.append("SYNCS try-waits (the C loads' full barriers among them), the branch on each one's predicate, and")
    lines.append("their retry loops.")
    for r in runs:
        epi = r["roles"].get("epilogue", {}).get("samples", 0)
        lines += ["", f"{r['run']}: the epilogue's most sampled source lines (share of the epilogue's samples)", "",
                  "| source line | share | top reasons |", "|---|---|---|"]
        for i in r["top_epilogue_lines"][:8]:
            why = ", ".join(f"{k} {v}" for k, v in list(i["reasons"].items())[:2])
            lines.append(f"| {i['source']} | {i['samples'] / epi if epi else 0.0:.3f} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path, help="profile-epilogue-stalls' file (.txt, or .txt.gz)")
    ap.add_argument("--objects", type=Path, default=LINEINFO_CACHE_DIR,
                    help="the objects built with line info that were profiled (default: LINEINFO_CACHE_DIR)")
    ap.add_argument("--environment", type=Path, help="the run's environment line (epilogue-stalls-environment.txt)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    try:
        raw = args.profile.read_bytes()
        text = (gzip.decompress(raw) if args.profile.suffix == ".gz" else raw).decode()
    except (OSError, gzip.BadGzipFile, UnicodeDecodeError) as e:
        print(f"epilogue_stalls: cannot read {args.profile}: {e}", file=sys.stderr)
        return 2
    environment = None
    if args.environment:
        try:  # the line lab/bench/h200.sh's fingerprint_line wrote
            environment = json.loads(args.environment.read_text().strip().removeprefix("environment: "))
        except (OSError, ValueError) as e:
            print(f"epilogue_stalls: --environment {args.environment}: not an environment line ({e})", file=sys.stderr)
            return 2
    runs = read_runs(text)
    if not runs:
        print(f"epilogue_stalls: no source page in {args.profile}", file=sys.stderr)
        return 2
    try:
        objects = objects_sass(args.objects)
    except (OSError, ValueError, subprocess.CalledProcessError) as e:
        print(f"epilogue_stalls: cannot disassemble the objects under {args.objects}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return 2
    if not objects:
        print(f"epilogue_stalls: no objects under {args.objects} (bench.precompile --lineinfo)", file=sys.stderr)
        return 2
    out = []
    for name, rows in runs.items():
        obj, sass, score = match_object(rows, objects)
        if score < 0.95:
            print(f"epilogue_stalls: {name}: no object matches its SASS (best {score:.2f}); skipped", file=sys.stderr)
            continue
        out.append(summarize(name, rows, obj, sass, score))
    from epiforge.eval.machine import command_line

    report = {"runs": out, "command": command_line("lab.bench.epilogue_stalls", argv)}
    if environment is not None:
        report["environment"] = environment
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    md = markdown(out)
    if args.md:
        args.md.write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
