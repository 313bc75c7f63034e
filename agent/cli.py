"""The agent's subcommands of the epiforge CLI: generate, replay (and fork), ablate.

    epiforge generate --task k8 --backend anthropic [--model M] [--max-turns N] [--budget-usd X]
    epiforge generate --resume logs/<session>.jsonl          # continue a killed session
    epiforge replay logs/<session>.jsonl                      # offline, kernels re-evaluated here
    epiforge replay LOG --fork-at 3 --backend openai --base-url http://127.0.0.1:8000/v1 --model M
    epiforge ablate --task k8 --backend anthropic --runs 5 --pack-without operands --pack-without logs/k0

Nothing heavy is imported until a command runs (no SDK, no quack for --help).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_commands(sub) -> None:
    """Register the agent's subcommands on the epiforge parser (and the demo's options)."""
    demo = sub.choices.get("demo")
    if demo is not None:
        demo.add_argument("--log", default=None, help="the session to replay (default: the example in logs/examples/)")
        demo.add_argument("--experts", action="store_true", help="also evaluate every expert kernel on the CPU (~1 min)")
    p = sub.add_parser("generate", help="let an LLM backend write a kernel for a task")
    p.add_argument("--task", help="task id or name, e.g. k8")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"])
    _backend_options(p)
    _session_options(p)
    p.add_argument("--resume", metavar="LOG", help="continue a killed session from its log (appends to it)")
    p.add_argument("--log-dir", default=None, help="where the session log goes (default: logs/)")
    p.add_argument("--workspace", default=None, help="the session's working directory (default: .epiforge/workspaces/ID)")
    p.add_argument("--json", action="store_true", help="print the session_ended event as JSON")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("replay", help="re-run a recorded session offline (or fork it into a live backend)")
    p.add_argument("log", help="a session log (JSONL)")
    p.add_argument("--fork-at", type=int, default=None, metavar="N", help="replay steps < N, then continue live")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"], help="the live backend of a fork")
    _backend_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="override the recorded sm_90a cross-compile setting")
    p.add_argument("--max-turns", type=int, default=None, help="a fork's turn budget (default: as recorded)")
    p.add_argument("--docs-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--log-dir", default=None, help="where the new log goes (default: .epiforge/replays/, forks: logs/)")
    p.add_argument("--json", action="store_true", help="print the replay report as JSON")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("ablate", help="knowledge-pack ablation: runs with and without pages, and a report")
    p.add_argument("--task")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"])
    _backend_options(p)
    _session_options(p)
    p.add_argument("--runs", type=int, default=3, help="sessions per condition")
    p.add_argument("--from-logs", metavar="DIR", default=None, help="only report, from the session logs in DIR")
    p.add_argument("--log-dir", default=None, help="where the sessions' logs go (default: logs/ablations/<time>/)")
    p.add_argument("--report", default=None, metavar="PATH", help="also write the report as JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ablate)


def _backend_options(p) -> None:
    p.add_argument("--model", default=None, help="model name (anthropic default: claude-sonnet-4-5; command: a label)")
    p.add_argument("--base-url", default=None, help="API base URL (anthropic: ANTHROPIC_BASE_URL; openai: OPENAI_BASE_URL)")
    p.add_argument("--command", default=None, help="command backend: the agent CLI to run in the workspace")
    p.add_argument("--timeout", type=float, default=None, help="seconds per API request (command: per run)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None, help="stream responses (anthropic default: on)")
    p.add_argument("--max-output-tokens", type=int, default=8192)


def _session_options(p) -> None:
    p.add_argument("--max-turns", type=int, default=30)
    p.add_argument("--budget-usd", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="input + output tokens over the session")
    p.add_argument("--max-wall-s", type=float, default=None)
    p.add_argument("--pack-without", action="append", default=[], metavar="DOC",
                   help="leave this primitive_docs page out of the knowledge pack (repeatable)")
    p.add_argument("--docs-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="cross-compile every epilogue for sm_90a in checks (default: on)")
    p.add_argument("--device", choices=["auto", "cpu"], default="auto", help="auto: also use a Hopper GPU when present")
    p.add_argument("--speed-target", type=float, default=1.05, help="kernel / GEMM-only time to reach (GPU)")


def _die(msg: str, code: int = 2) -> int:
    print(f"epiforge: {msg}", file=sys.stderr)
    return code


def _live_backend(args, name: str | None = None, *, model=None, base_url=None, command=None):
    """The live backend the options name; the keyword arguments fill options left unset."""
    from agent.backends import make_backend

    return make_backend(name or args.backend, model=args.model or model, base_url=args.base_url or base_url,
                        command=args.command or command, max_output_tokens=args.max_output_tokens,
                        timeout_s=args.timeout, stream=args.stream, note=lambda line: print(line, file=sys.stderr))


def _config(args):
    from agent.session import Budget, SessionConfig

    budget = Budget(max_turns=args.max_turns, max_tokens=args.max_tokens, max_usd=args.budget_usd,
                    max_wall_s=args.max_wall_s)
    return budget, lambda backend: SessionConfig(
        task=args.task, backend=backend.name, model=backend.model, base_url=getattr(backend, "base_url", None),
        budget=budget, compile=args.compile, device=args.device, speed_target=args.speed_target,
        pack_without=list(args.pack_without), max_output_tokens=args.max_output_tokens, command=args.command)


def cmd_generate(args) -> int:
    from agent.backends import BackendError

    try:
        if args.resume:
            from agent.loop import resume_session
            from agent.session import read_events

            cfg = read_events(Path(args.resume))[0][0].config
            if cfg.backend == "replay":
                return _die(f"{args.resume} is a replay: run epiforge replay on its recording again instead")
            backend = _live_backend(args, cfg.backend, model=cfg.model, base_url=cfg.base_url, command=cfg.command)
            end, _ = resume_session(Path(args.resume), backend, workspace=args.workspace,
                                    docs_dir=args.docs_dir, say=print)
        else:
            if not (args.task and args.backend):
                return _die("generate needs --task and --backend (or --resume LOG)")
            from agent.loop import DEFAULT_LOG_DIR, run_session
            import tasks

            tasks.get_task(args.task)  # an unknown task is one line before any backend is made
            backend = _live_backend(args)
            _, make_config = _config(args)
            try:
                end, _ = run_session(make_config(backend), backend, log_dir=Path(args.log_dir or DEFAULT_LOG_DIR),
                                     workspace=args.workspace, docs_dir=args.docs_dir, say=print)
            finally:
                backend.close()
    except BackendError as e:
        return _die(str(e))
    if args.json:
        print(end.model_dump_json(indent=1))
    if end.outcome == "backend_error":
        return _die(end.reason)
    return 0 if end.outcome in ("passed", "passed_slow") else 1


def cmd_replay(args) -> int:
    from agent.backends import BackendError
    from agent.loop import DEFAULT_LOG_DIR, WORKSPACES
    from agent.replay import replay

    if args.fork_at is not None and not args.backend:
        return _die("--fork-at needs --backend: the live backend that continues the session")
    if args.backend and args.fork_at is None:
        return _die("--backend is for forks: add --fork-at N")
    try:
        live = _live_backend(args) if args.backend else None
        log_dir = Path(args.log_dir) if args.log_dir else (DEFAULT_LOG_DIR if live else WORKSPACES.parent / "replays")
        report = replay(Path(args.log), log_dir=log_dir, fork_at=args.fork_at, live=live, docs_dir=args.docs_dir,
                        compile=args.compile, out_dir=_fork_out_dir() if live else None,
                        say=(lambda line: print(line, file=sys.stderr)) if args.json else print,
                        max_turns=args.max_turns)
    except BackendError as e:
        return _die(str(e))
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_replay(report)
    if args.fork_at is not None:
        return 0 if report.outcome in ("passed", "passed_slow") else 1
    return 0 if report.reproduced else 1


def _fork_out_dir():
    from eval.kernel import GENERATED_DIR

    return GENERATED_DIR


def print_replay(report, say=print) -> None:
    if report.fork_at is not None:
        say(f"fork of {report.session} at step {report.fork_at}: {report.outcome}; new log {report.new_log}")
    else:
        verdict = "reproduced" if report.reproduced else "DIVERGED"
        say(f"replay of {report.session}: recorded {report.recorded_outcome}, replayed {report.outcome} "
            f"in {report.steps} steps: {verdict}")
    for d in report.divergences:
        say("  diverges: " + d.line())
    for d in report.differences:
        say("  differs: " + d.line())
    for w in report.warnings:
        say("  note: " + w)


def cmd_ablate(args) -> int:
    import datetime as _dt

    from agent.ablate import print_report, report, rows_json, run_ablation
    from agent.backends import BackendError
    from agent.loop import DEFAULT_LOG_DIR

    if args.from_logs:
        logs = sorted(Path(args.from_logs).glob("*.jsonl"))
        if not logs:
            return _die(f"no session logs (*.jsonl) in {args.from_logs}")
    else:
        if not (args.task and args.backend and args.pack_without):
            return _die("ablate needs --task, --backend and at least one --pack-without DOC (or --from-logs DIR)")
        import tasks

        tasks.get_task(args.task)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        log_dir = Path(args.log_dir) if args.log_dir else DEFAULT_LOG_DIR / "ablations" / stamp
        try:
            probe = _live_backend(args)  # a missing key or option fails here, before any run
            _, make_config = _config(args)
            config = make_config(probe).model_copy(update={"pack_without": []})
            probe.close()
            logs = run_ablation(config, lambda: _live_backend(args), pages=args.pack_without, runs=args.runs,
                                log_dir=log_dir, docs_dir=args.docs_dir, say=print)
        except BackendError as e:
            return _die(str(e))
    rows = report(logs, warn=lambda line: print(line, file=sys.stderr))
    if args.report:
        Path(args.report).write_text(json.dumps(rows_json(rows), indent=1) + "\n")
    if args.json:
        print(json.dumps(rows_json(rows), indent=1))
    else:
        print_report(rows)
    return 0
