"""epiforge command line: thin; it parses, calls tasks/, eval/ or agent/, prints.

    epiforge tasks list [--json]            the task catalogue
    epiforge tasks show NAME [--json]       one task in full
    epiforge eval --task T --kernel K ...   evaluate one kernel (see --help)
    epiforge compile --task T --kernel K    cross-compile a kernel's epilogues for sm_90a (no GPU needed)
    epiforge demo                           the main job on its embedded default (no API key, no GPU)
    epiforge generate / replay / ...        the agent (agent/cli.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _die(msg: str, code: int = 2) -> int:
    print(f"epiforge: {msg}", file=sys.stderr)
    return code


def os_error_line(e: OSError) -> str:
    """An OSError in one line: the file and why, without the errno."""
    if e.strerror and e.filename:
        return f"{e.filename}: {e.strerror}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


#: the width of rich's tables when stdout is no terminal: rich's default there is 80 columns,
#: which cut task names and numbers with an ellipsis ($COLUMNS still decides when set)
PIPE_WIDTH = 200


def console():
    """rich's console for the commands' tables and lines."""
    from rich.console import Console

    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=PIPE_WIDTH if piped else None)


# ---- tasks --------------------------------------------------------------------------------


def cmd_tasks_list(args) -> int:
    from epiforge import tasks

    catalogue, errors = tasks.load_catalogue()
    for e in errors:
        print(f"epiforge: skipped a malformed task: {e}", file=sys.stderr)
    sets = tasks.shape_sets()
    if args.json:
        print(json.dumps([t.summary(sets) for t in catalogue], indent=1))
        return 1 if errors else 0
    from rich.table import Table

    from rich.text import Text

    table = Table(title="epiforge tasks (GEMM m x n x k at the paper's 1B scale)")
    for col in ("id", "name", "title", "gemm (1B)", "launches"):
        table.add_column(col)
    one_b = sets["paper"][0].dims()
    for t in catalogue:
        if t.gemm_count == 1:
            m, n, k = t.gemm_shape(one_b)
            gemm = f"{m} x {n} x {k}"
        else:
            gemm = f"{t.gemm_count} GEMMs, {t.flops(one_b) / 1e12:.1f} TFLOP in all"
        table.add_row(*(Text(x) for x in (t.id, t.name, t.title, gemm, ", ".join(t.launches))))
    console().print(table)
    return 1 if errors else 0


def cmd_tasks_show(args) -> int:
    from epiforge import tasks
    from epiforge.eval.machine import REPO, expert_kernel

    task = tasks.get_task(args.name)
    summary = task.summary(tasks.shape_sets())
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    con = console()

    def say(text: str, style: str | None = None) -> None:  # the task's text as written: brackets are not markup
        con.print(text, style=style, markup=False, highlight=False, soft_wrap=True)

    say(f"{task.name} ({task.id}): {task.title}\n", "bold")
    say(task.description.strip() + "\n")
    for where, g in task.gemm_list:
        a = f"{g.a} ({g.m} x {g.k})" if g.a_layout == "mk" else f"{g.a}^T ({g.a} is {g.k} x {g.m})"
        b = f"{g.b}^T ({g.b} is {g.n} x {g.k})" if g.b_layout == "nk" else f"{g.b} ({g.k} x {g.n})"
        say(f"{'GEMM' if where == 'gemm' else where}: D ({g.m} x {g.n}) = {a} @ {b}")
    say(f"launches: {', '.join(task.launches)}")
    say(f"precisions: {', '.join(task.dtypes)} (judged in every one unless --dtype narrows it, timed in "
        f"{task.dtypes[0]}; \"precision\" below is the run's)")
    for title, specs in (("inputs", task.inputs), ("outputs", task.outputs)):
        say(f"\n{title}", "bold")
        for t in specs:
            tag = " (constant)" if getattr(t, "constant", False) else ""
            dtype = f"precision ({' | '.join(task.dtypes)})" if t.follows_precision else t.dtype
            say(f"  {t.name}: [{', '.join(t.shape)}] {dtype}{tag}: {t.description}  ({t.layout_text})")
    for s in task.scalars:
        say(f"  scalar {s.name} = {s.value}: {s.description}")
    say("\ntolerance: max|out - ref| <= factor * max|ref_lowprec - ref| + atol per output, the RMS error likewise:")
    for o in task.outputs:
        tol = o.tolerance
        say(f"  {o.name}: factor {tol.factor:g}, atol {tol.atol:g}, rms_factor "
            f"{'off' if tol.rms_factor is None else f'{tol.rms_factor:g}'}")
    gemm_names = [where for where, _ in task.gemm_list]
    say("\nshapes (--shapes NAME; hidden shapes come from the seed and are not listed)"
        + (": dims, then each GEMM's m x n x k" if len(gemm_names) < 4 else ": dims (GEMMs: --json)"), "bold")
    for set_name, shapes in tasks.shape_sets().items():
        for s in shapes:
            dims = s.dims()
            line = f"  {set_name} {s.name}: " + " ".join(f"{k}={v}" for k, v in dims.items())
            if len(gemm_names) < 4:
                line += "; " + ", ".join(f"{'GEMM' if w == 'gemm' else w} {m} x {n} x {k}"
                                         for w, (m, n, k) in zip(gemm_names, task.gemm_shapes(dims)))
            say(line)
    expert = expert_kernel(task.name)
    say(f"\nexpert kernel: {expert.relative_to(REPO) if expert else 'none (the expert track is empty)'}")
    return 0


# ---- eval / compile --------------------------------------------------------------------


def _gpu_refused(device: str) -> None:
    """ValueError (one line) when --device asks for a GPU this machine lacks: a judge started
    there would fail at its first CUDA call and blame the kernel."""
    if device in ("gpu", "cuda"):
        from epiforge.eval.machine import hopper_problem

        problem = hopper_problem()
        if problem:
            raise ValueError(f"--device {device}: {problem} (use --device cpu for the emulator)")


#: GEMM work per pass over a shape set above which the CPU emulator takes minutes (float64
#: references and the kernel's own pass, each trial): say so before the wait, not after
CPU_FLOP_NOTE = 1e12


def _warn_if_large_on_the_cpu(task_name: str, shapes: str, timeout_s: float | None) -> None:
    from epiforge import tasks
    from epiforge.eval.evaluation import DEFAULT_TIMEOUT_S

    rows = tasks.shape_sets().get(shapes)
    if not rows:
        return  # the judge names the unknown set
    flop = sum(tasks.get_task(task_name).flops(row.dims()) for row in rows)
    if flop > CPU_FLOP_NOTE:
        limit = timeout_s or DEFAULT_TIMEOUT_S["cpu"]
        print(f"epiforge: note: --shapes {shapes} on the CPU emulator is {flop / 1e12:.1f} TFLOP of GEMMs per pass at "
              f"full size: expect minutes, and TIMEOUT past --timeout ({limit:g} s); a Hopper GPU takes "
              "milliseconds (--device gpu)", file=sys.stderr)


def cmd_eval(args) -> int:
    from epiforge.eval import evaluate

    _gpu_refused(args.device)
    if args.device == "cpu":
        _warn_if_large_on_the_cpu(args.task, args.shapes, args.timeout)
    store = None
    if args.store:  # opened before the evaluation: a bad file must not cost the run
        from epiforge.eval.store import ResultStore

        store = ResultStore(args.store)
    result = evaluate(args.task, args.kernel, device=args.device, shapes=args.shapes, seed=args.seed,
                      timeout_s=args.timeout, compile=args.compile, dtype=args.dtype,
                      launcher=not args.one_process)
    if store is not None:
        store.add(result)
    if args.json:
        print(result.model_dump_json(indent=1))
    else:
        con = console()
        color = "green" if result.passed else "red"
        tag = " (provisional: CPU emulator only; a Hopper GPU run makes it final)" if result.provisional else ""
        precisions = ", ".join(result.dtypes)
        con.print(f"{result.task} / {result.kernel} on {result.device} ({result.shapes} + hidden shapes; {precisions}): "
                  f"[{color}]{result.outcome.value}[/{color}]{tag} (stage: {result.stage})", markup=True,
                  highlight=False)
        con.print(result.message, markup=False)
        for v in result.violations[:10]:
            con.print(f"  {v}", markup=False)
        if result.worst:
            w = result.worst
            con.print(f"worst element: {w['shape']} {w['output']}{w['index']}: got {w['got']}, expected {w['expected']}, "
                      f"allowed {w['allowed']}", markup=False)
        for s in result.per_shape:
            if s.hidden:
                con.print(f"  hidden shape ({s.dtype}): {s.outcome.value}", markup=False)
            if s.timing:  # only timed kernels show a speed; IMPLAUSIBLE ones are quarantined
                t = s.timing
                tag = " (quarantined: implausible)" if s.outcome.value == "IMPLAUSIBLE" else ""
                over = t.fused_over_gemm_only
                ci = f" (95% interval {over.ci_low:.3f}-{over.ci_high:.3f})" if over.ci_low is not None else ""
                con.print(f"  {s.shape} ({s.dtype}): {t.kernel.median_us:.1f} us = {over.median:.3f}x GEMM-only{ci}, "
                          f"{t.speedup['eager'].median:.2f}x faster than eager PyTorch{tag}", markup=False)
        if not result.passed and result.stderr_tail:
            con.print("[dim]--- stderr (tail) ---[/dim]")
            con.print(result.stderr_tail[-1500:], markup=False)
    return 0 if result.passed else 1


def cmd_compile(args) -> int:
    from epiforge.eval import evaluate

    result = evaluate(args.task, args.kernel, device="cpu", shapes=args.shapes, compile=True, seed=args.seed,
                      dtype=args.dtype, tuned=args.tuned)
    compiled_ok = bool(result.compiled) and all(c["ok"] for c in result.compiled)
    if args.json:
        print(json.dumps({"task": result.task, "kernel": result.kernel, "dtypes": result.dtypes,
                          "outcome": result.outcome.value,
                          "message": result.message, "compiled": result.compiled,
                          "compiled_ok": compiled_ok}, indent=1))
    else:
        for c in result.compiled:
            print(f"{result.kernel}: {c['epilogue']} [{c['config']}] {'ok' if c['ok'] else 'FAILED'} in {c['seconds']} s")
        if not result.compiled:
            never = result.stage == "static" or result.outcome.value == "TASK_ERROR"
            why = "the judge stopped before the kernel ran" if never else "the kernel never launched a fused GEMM"
            print(f"{result.kernel}: nothing was compiled for sm_90a ({why})")
        print(f"the CPU judge's verdict (the exit status is the compile's): {result.outcome.value}: {result.message}")
    return 0 if compiled_ok and result.outcome.value != "COMPILE_ERROR" else 1


# ---- compare ---------------------------------------------------------------------------------


def _picks(task_name: str, spec: str) -> bool:
    """Does the kernel spec pick any kernel of this task?"""
    from epiforge.eval.compare import select_kernels

    try:
        return bool(select_kernels(task_name, [spec], one_of_several=True))
    except ValueError:
        return False


def cmd_compare(args) -> int:
    from epiforge import tasks
    from epiforge.eval.compare import compare_all, select_kernels
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    device = args.device
    if args.ray is not None:  # before any work: without Ray, one line that says what to install
        from epiforge.eval.cluster import import_ray

        import_ray()
        if device == "auto":  # this machine's GPU says nothing of the cluster's workers
            raise ValueError("--ray: name the workers' device, --device gpu or --device cpu")
        if args.warm:
            raise ValueError("--warm builds the baselines on this machine; on --ray each worker builds its own")
    elif device == "auto":
        from epiforge.eval.machine import hopper_available

        device = "gpu" if hopper_available() else "cpu"
    else:
        _gpu_refused(device)  # on --ray the workers' judges check their own GPU
    if args.reps < 1:
        raise ValueError(f"--reps must be at least 1 (got {args.reps})")
    if not args.all:
        names = list(dict.fromkeys(tasks.get_task(t).name for t in args.task))  # one judge, in the order given
    else:
        names = [t.name for t in tasks.load_catalogue()[0]]
    several = len(names) > 1  # a generated:... filter need match in one task only
    plans = []
    for name in names:
        try:
            plans.append((name, select_kernels(name, args.kernels, one_of_several=several)))
        except ValueError as e:  # e.g. no expert kernel and nothing generated: nothing to judge there
            if not args.all:
                raise
            print(f"epiforge: skipped {name}: {str(e).splitlines()[0]}", file=sys.stderr)
    if not plans:
        raise ValueError(f"--all: no task has any of the kernels {args.kernels}")
    for spec in args.kernels if several else ():
        if spec.startswith("generated:") and not any(_picks(name, spec) for name, _ in plans):
            raise ValueError(f"--kernels {spec}: no generated kernel of these tasks matches")
    store = None
    if args.store:
        from epiforge.eval.store import ResultStore

        store = ResultStore(args.store)
    from epiforge.eval.baselines import REGISTRY, STANDARD

    unknown = [b for b in args.baselines if b not in REGISTRY]
    if unknown:
        raise ValueError(f"--baselines: unknown {unknown}; known: {', '.join(REGISTRY)}")
    comparisons = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True,
                  disable=args.json) as progress:
        built = [b for b in args.baselines if b not in STANDARD]
        if device == "gpu" and len(plans) > 1 and built and args.warm:
            from epiforge.eval.warm import JOBS, warm_all

            warming = progress.add_task(f"building the baselines of {len(plans)} tasks, {JOBS} at a time", total=len(plans))
            warmed = warm_all([name for name, _ in plans], args.shapes, built,
                              on_done=lambda name, line: progress.advance(warming))
            progress.remove_task(warming)
            for name, line in warmed.items():
                if line != "ok":
                    print(f"epiforge: {name}'s baselines were not built ahead ({line}): its judge builds them",
                          file=sys.stderr)
        job = progress.add_task("compare", total=len(plans))

        def done(cmp) -> None:
            comparisons.append(cmp)
            if store is not None and args.ray is None:  # on Ray, compare_on_ray stores each under its key
                for r in cmp.results:
                    store.add(r)
            if not args.json:  # each task's table as soon as it is judged: a long --all shows its progress
                progress.console.print(render_comparison(cmp), markup=False, highlight=False, soft_wrap=True)
            progress.advance(job)

        kernels_of = {name: len(kernels) for name, kernels in plans}
        if args.ray is not None:
            from epiforge.eval.cluster import compare_on_ray

            progress.update(job, description=f"{len(plans)} task(s) on the Ray cluster")
            compare_on_ray(plans, address=None if args.ray == "local" else args.ray, device=device,
                           shapes=args.shapes, seed=args.seed, compile=device == "cpu", reps=args.reps,
                           baselines=args.baselines, dtype=args.dtype, launcher=not args.one_process,
                           on_done=done, store=store)
        else:
            progress.update(job, description=f"{plans[0][0]}: {kernels_of[plans[0][0]]} kernel(s) on {device}")
            compare_all(plans, device=device, shapes=args.shapes, seed=args.seed, compile=device == "cpu",
                        reps=args.reps, baselines=args.baselines, dtype=args.dtype, on_done=done,
                        launcher=not args.one_process,
                        on_stage=lambda name, st: progress.update(job, description=f"{name}: {st}"))
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in comparisons], indent=1))
    return 0 if all(r.passed for c in comparisons for r in c.results) else 1


def render_comparison(cmp) -> str:
    """One task's comparison as a Markdown table: per kernel and shape the fraction of the
    speed of light, the speedup over each baseline timed (median and 95% interval, from the
    one interleaved run) and generated / expert time; then what each baseline computed, or
    why it was left out."""
    from epiforge.eval.baselines import REPORTED

    results = list(zip(cmp.labels, cmp.results))
    timed = [s.timing for _, r in results for s in r.per_shape if s.timing]
    shown = [b for b in REPORTED if any(b in t.speedup for t in timed)]
    head = ["kernel", "track", "outcome", "sm_90a build", "shape", "fraction of the speed of light",
            *(f"x {b} (95%)" for b in shown), "vs expert (time, 95%)"]
    lines = [f"## {cmp.task} on {'the GPU' if cmp.device == 'cuda' else 'the CPU'} ({cmp.shapes} shapes)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cmp_dtypes = {s.dtype for _, r in results for s in r.per_shape}
    for label, r in results:
        build = ("-" if not r.compiled else "ok" if all(c.get("ok") for c in r.compiled) else "FAILED")
        outcome = r.outcome.value + (" (provisional)" if r.provisional else "")
        shapes = [s for s in r.per_shape if not s.hidden] or [None]
        for s in shapes:
            t = s.timing if s else None
            sol = f"{t.fraction_of_speed_of_light:.3f}" if t else "-"
            speedups = [_ratio_cell(t.speedup.get(b) if t else None, "x") for b in shown]
            vs = cmp.versus(label, "expert", s.shape, s.dtype) if s and label != "expert" else None
            where = (f"{s.shape} ({s.dtype})" if s.dtype != "bfloat16" or len(cmp_dtypes) > 1 else s.shape) if s else "-"
            lines.append("| " + " | ".join([label, r.track, outcome, build, where, sol, *speedups,
                                            _ratio_cell(vs, "")]) + " |")
        if not r.passed:
            lines.append(f"|  |  | {r.message[:160].replace('|', '/')} |" + "  |" * (len(head) - 3))
    notes = {}
    for t in timed:
        for name, note in t.notes.items():
            if name in REPORTED or name == "gemm_only":
                notes.setdefault(name, note.replace("|", "/"))
    if notes:
        lines += ["", *(f"- {name}: {note}" for name, note in notes.items())]
    spent = max((r.stage_s for r in cmp.results), key=lambda d: sum(d.values()), default={})
    if spent:
        lines += ["", f"Judged in {sum(spent.values()):.0f} s: "
                      + ", ".join(f"{stage} {s:.0f} s" for stage, s in spent.items() if s >= 0.5) + "."]
    if cmp.device == "cpu":
        lines += ["", "Timing: absent. Nothing is timed on a CPU (the emulator's speed says nothing about the GPU's); "
                      "run `epiforge compare --device gpu` on a Hopper GPU for one interleaved run of these kernels "
                      "beside the baselines."]
    return "\n".join(lines) + "\n"


def _ratio_cell(stat, unit: str) -> str:
    if stat is None:
        return "-"
    interval = f" ({stat.ci_low:.3f}-{stat.ci_high:.3f})" if stat.ci_low and stat.ci_high else ""
    return f"{stat.median:.3f}{unit}{interval}"


# ---- leaderboard -------------------------------------------------------------------------


def cmd_leaderboard(args) -> int:
    from pathlib import Path

    from epiforge.eval import leaderboard as lb
    from epiforge.eval.store import DEFAULT_PATH, ENV_PATH, ResultStore

    import os

    results, sources = [], []
    if not args.no_shipped:
        results += lb.load_shipped()
        sources += lb.describe_shipped()
    if args.html:  # before any work: the page's folder must take it
        from epiforge.agent.loop import output_file_problem

        problem = output_file_problem("--html", Path(args.html))
        if problem:
            raise ValueError(problem)
    path = Path(args.store or os.environ.get(ENV_PATH) or DEFAULT_PATH)
    if args.store or path.exists():
        stored = [row.result for row in ResultStore(path, read_only=True).rows()]
        results += stored
        sources.append(f"the store {path}: {len(stored)} result{'' if len(stored) == 1 else 's'}")
    elif os.environ.get(ENV_PATH):
        print(f"epiforge: no results store at {path} (${ENV_PATH}) yet", file=sys.stderr)
    logs = [Path(d) for d in (args.logs or [])]
    for d in logs:
        if not d.is_dir():
            raise ValueError(f"--logs {d}: not a directory")
    if args.logs is None:  # by default, the shipped sessions and the ones this user ran (where generate writes them)
        from epiforge.eval.machine import data_dir

        mine = data_dir() / "sessions"
        logs = [mine] if mine.is_dir() else []
        if not args.no_shipped and lb.SHIPPED_SESSIONS.is_dir():
            logs.insert(0, lb.SHIPPED_SESSIONS)
            sources.append(lb.SHIPPED_SESSIONS_SOURCE)
    if [d for d in logs if d != lb.SHIPPED_SESSIONS]:
        sources.append("agent sessions: " + ", ".join(str(d) for d in logs if d != lb.SHIPPED_SESSIONS))
    board = lb.build(results, lb.agent_rows(logs), sources)
    if args.html:
        from epiforge.eval.leaderboard_html import write_html

        write_html(board, Path(args.html))
        print(f"wrote {args.html}", file=sys.stderr)
    print(lb.render_markdown(board), end="")
    return 0


# ---- demo (the main job) ---------------------------------------------------------------


def cmd_demo(args) -> int:
    from epiforge.agent.demo import run_demo

    return run_demo(args)


def add_dtype_flag(p: argparse.ArgumentParser) -> None:
    """--dtype, the precisions a kernel is judged in (eval.evaluation.pick_dtypes)."""
    p.add_argument("--dtype", default=None, metavar="PRECISIONS",
                   help="the precisions to judge in: bfloat16 | bf16, float16 | fp16, a comma list of them, or all "
                        "(every one the task lists, `tasks show`: the default). Naming fewer narrows the verdict, and "
                        "its message says which were not judged. On a GPU only the first is timed")


SHAPES_HELP = ("shape set: smoke (small, the default), paper (the paper's 1B, 7B, 70B), or another set of "
               "tasks/shapes.toml (a wrong name lists them)")
KERNEL_HELP = "human (or expert: the task's expert kernel) | generated:ID (from generated_kernels/ or DATA/kernels/) | PATH"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epiforge", description="LLM-written fused GEMM epilogues, proved right and fast.")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tasks", help="the task catalogue").add_subparsers(dest="tasks_command", required=True)
    p = t.add_parser("list", help="list the tasks")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_list)
    p = t.add_parser("show", help="show one task")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks_show)

    p = sub.add_parser("eval", help="evaluate one kernel on one task")
    p.add_argument("--task", required=True)
    p.add_argument("--kernel", required=True, help=KERNEL_HELP)
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu", "cuda"])
    p.add_argument("--shapes", default="smoke", help=SHAPES_HELP)
    p.add_argument("--seed", type=int, default=None, help="default: a fresh secret seed")
    p.add_argument("--timeout", type=float, default=None,
                   help="the whole evaluation's limit in seconds (default: 600 on a CPU, 900 on a GPU)")
    p.add_argument("--compile", action="store_true", help="on a CPU, also cross-compile every epilogue for sm_90a")
    p.add_argument("--one-process", action="store_true",
                   help="run the kernel in its own process instead of from its description: its launch record is "
                        "then its own (tests/exploits/CLASSES.md lists what that lets through); by default the "
                        "kernel's process only describes its calls and a process without kernel code runs them")
    add_dtype_flag(p)
    p.add_argument("--store", default=None, help="also record the result in this SQLite file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("compile", help="cross-compile a kernel's epilogues for sm_90a (no GPU needed)")
    p.add_argument("--task", required=True)
    p.add_argument("--kernel", required=True, help=KERNEL_HELP)
    p.add_argument("--shapes", default="smoke", help=SHAPES_HELP)
    p.add_argument("--seed", type=int, default=0)
    add_dtype_flag(p)
    p.add_argument("--tuned", action="store_true",
                   help="also build every epilogue with each config of the kernel's TUNED table (the configs the paper "
                        "shapes pick; the smoke shapes never do)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("compare", help="expert and generated kernels of a task judged (on a GPU: timed) together",
                       description="Judge several kernels of a task together: correctness and the sm_90a build on a "
                                   "CPU; on a Hopper GPU also ONE interleaved run per shape of all of them beside the "
                                   "baselines, so generated / expert is measured repetition by repetition.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--task", nargs="+", help="a task id or name, e.g. k8; several are judged in turn by one judge")
    where.add_argument("--all", action="store_true", help="every task")
    p.add_argument("--kernels", nargs="+", default=["expert", "generated"],
                   help="expert | generated | generated:<ID> | generated:backend=<b> | generated:model=<m> | "
                        "generated:session=<s> | a path (default: expert generated). Generated kernels are "
                        "looked up in the repository's generated_kernels/ and in DATA/kernels/, where generate "
                        "puts them")
    p.add_argument("--shapes", default="smoke", help=SHAPES_HELP)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"],
                   help="auto (default): a Hopper GPU when there is one, else the CPU")
    p.add_argument("--reps", type=int, default=30,
                   help="timed repetitions per shape on a GPU (default: 30, as lab/bench/run.py; each repetition "
                        "times every kernel and baseline once, in a fresh random order)")
    p.add_argument("--baselines", nargs="*", default=["coda", "torch_compile", "liger", "flashinfer", "quack_library"],
                   help="baselines timed beside cuBLAS, quack's plain GEMM (the speed of light) and eager PyTorch, "
                        "on a GPU (default: coda torch_compile liger flashinfer quack_library; coda needs "
                        "EPIFORGE_CODA_ENV, see eval/coda.py; see eval/baselines.py)")
    p.add_argument("--seed", type=int, default=None, help="default: a fresh secret seed")
    p.add_argument("--store", default=None, help="also record every Result in this SQLite file")
    p.add_argument("--warm", action="store_true",
                   help="with --all on a GPU: build every task's baselines ahead, several at a time, before the "
                        "first timed run (eval/warm.py; otherwise the judge builds each task's as it comes to it). "
                        "It saves a new machine's cold builds, not each judge's own first builds")
    p.add_argument("--one-process", action="store_true",
                   help="run each kernel in its own process instead of from its description (as eval --one-process)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="spread the tasks over a Ray cluster, one Ray task each (eval/cluster.py): ADDRESS a running "
                        "cluster's (auto: the one this machine is in), none: a local one started for this run. "
                        "Needs pip install 'epiforge[ray]' (default: every task on this machine, one judge)")
    add_dtype_flag(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("leaderboard", help="tasks x tracks and agents, from the store and the shipped H200 results",
                       description="Tasks x tracks (expert; generated per backend and model) from the results store "
                                   "and the H200 results shipped in eval/data, and pass@k per backend and model from "
                                   "agent session logs. Markdown on stdout.")
    p.add_argument("--store", default=None, help="a results file (default: $EPIFORGE_RESULTS or .epiforge/results.sqlite)")
    p.add_argument("--no-shipped", action="store_true", help="leave out the results (H200, H100) and the agent sessions (logs/generated) shipped with the repo")
    p.add_argument("--logs", nargs="*", default=None,
                   help="folders of agent session logs (JSONL) for pass@k (default: the sessions/ folder of the "
                        "data directory, $EPIFORGE_DATA_DIR or ~/.local/share/epiforge, where generate writes)")
    p.add_argument("--html", default=None, help="also write a static HTML page with plots to this file")
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("demo", help="the main job on its embedded default: no API key, no GPU")
    p.set_defaults(func=cmd_demo)

    try:
        from epiforge.agent.cli import add_commands
    except ImportError:
        add_commands = None
    if add_commands:
        add_commands(sub)
    return ap


def _task_folders(args) -> None:
    """--task (and `tasks show`'s name) may be a path to a task folder anywhere: it becomes the
    folder's task name, the folder findable by this process and the ones it starts."""
    for attr in ("task", "name") if args.func is cmd_tasks_show else ("task",):
        value = getattr(args, attr, None)
        if not value:  # a command without --task imports no tasks (and no torch) here
            continue
        from epiforge.tasks import task_arg

        if isinstance(value, str):
            setattr(args, attr, task_arg(value))
        elif isinstance(value, list):
            setattr(args, attr, [task_arg(v) for v in value])


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from epiforge.eval.kernel import KernelError
    from epiforge.primitives.epilogue import EpilogueError
    from epiforge.eval.store import StoreError
    from epiforge.tasks import TaskError

    try:
        if "EPIFORGE_TIMED_LEAD" in os.environ:  # read by every judge and runner: a bad value fails here, once
            from epiforge.eval.timing import Lead

            Lead.parse(os.environ["EPIFORGE_TIMED_LEAD"])
        _task_folders(args)
        code = args.func(args)
        sys.stdout.flush()  # inside the try: a reader that left shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # the reader of stdout went away (`| head`): quiet, as rich's console is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (TaskError, KernelError, EpilogueError, StoreError, ValueError, FileNotFoundError) as e:
        return _die(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:  # a folder or file that cannot be read or written: one line, never a traceback
        return _die(os_error_line(e))
    except KeyboardInterrupt:
        return _die("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
