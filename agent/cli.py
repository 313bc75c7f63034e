"""The agent's subcommands of the epiforge CLI: generate, replay (and fork), ablate, sessions.

    epiforge generate --task k8 --backend anthropic [--model M] [--max-turns N] [--budget-usd X]
    epiforge generate --resume LOG                            # continue a killed or failed session
    epiforge generate --task k8 --backend anthropic --runs 10 --concurrency 4   # pass@k over 10 sessions
    epiforge replay LOG                                       # offline, kernels re-evaluated here
    epiforge replay LOG --fork-at 3 --backend openai --base-url http://127.0.0.1:8000/v1 --model M
    epiforge ablate --task k8 --backend anthropic --runs 5 --concurrency 2 --pack-without operands
    epiforge sessions list [--log-dir DIR]                    # outcome, turns, tokens, dollars, kernel
    epiforge sessions show ID

Where sessions write, unless a flag says otherwise: the per-user data directory DATA
($EPIFORGE_DATA_DIR, else $XDG_DATA_HOME/epiforge, else ~/.local/share/epiforge; eval/machine.py
data_dir()): logs in DATA/sessions/, passing kernels in DATA/kernels/<task>/, workspaces in
DATA/workspaces/, replays in DATA/replays/, ablations in DATA/ablations/<time>/. A --log-dir
outside the repository and the data directory keeps kernels and workspaces beside its logs
(LOG_DIR/generated_kernels/, LOG_DIR/workspaces/). Nothing goes into the source tree unless a
flag names it: `--out generated_kernels` adds a passing kernel to the committed track.

Nothing heavy is imported until a command runs (no SDK, no quack for --help).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from epiforge.text import counted

#: session settings when neither a flag nor (on --resume) the log gives one
DEFAULTS = {"max_turns": 30, "compile": True, "device": "auto", "speed_target": 1.05, "max_output_tokens": 8192}
#: where each live backend reads its base URL from the environment
BASE_URL_ENV = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}

_GENERATE_EXAMPLES = """\
environment:
  ANTHROPIC_API_KEY    the key of --backend anthropic (required); ANTHROPIC_BASE_URL: its API URL
  OPENAI_API_KEY       the key of --backend openai (a local server needs none); OPENAI_BASE_URL: its URL
  EPIFORGE_DATA_DIR    where logs, kernels and workspaces go by default (else $XDG_DATA_HOME/epiforge,
                       else ~/.local/share/epiforge): DATA/sessions/, DATA/kernels/, DATA/workspaces/

examples:
  epiforge generate --task k1 --backend anthropic --budget-usd 2
  epiforge generate --task k8 --backend openai --base-url http://127.0.0.1:8000/v1 --model qwen2.5-coder
  epiforge generate --task k1 --backend command --command 'claude -p' --max-turns 3
  epiforge generate --task k1 --backend anthropic --log-dir /tmp/runs --json
  epiforge generate --task k1 --backend anthropic --out generated_kernels   # a pass joins the committed track
  epiforge generate --resume ~/.local/share/epiforge/sessions/20261130T181500Z-k1-3f9a2c.jsonl --max-retries 20
  epiforge generate --task k1 --backend anthropic --runs 10 --concurrency 4 --budget-usd 1 --json

A session that was killed, or ended on a backend error (an outage longer than the
retries), resumes from its last finished step with --resume; the flags and environment
given then replace what the log recorded, and the command says which values it used.

--runs N runs N independent sessions (for pass@k; the budgets apply to each run), at most
--concurrency C at a time, and prints one line per run and pass@k for k = 1..N. A run that
fails never stops the others; after Ctrl-C or a backend outage, each unfinished run's log
resumes on its own with --resume.
"""

_REPLAY_EXAMPLES = """\
environment (a replay needs none; a fork, its live backend's):
  ANTHROPIC_API_KEY    the key of --backend anthropic (required); ANTHROPIC_BASE_URL: its API URL
  OPENAI_API_KEY       the key of --backend openai (a local server needs none); OPENAI_BASE_URL: its URL
  EPIFORGE_DATA_DIR    where the new logs go by default (else $XDG_DATA_HOME/epiforge, else
                       ~/.local/share/epiforge): DATA/replays/, forks DATA/sessions/

examples:
  epiforge replay logs/examples/k8_gemm_swiglu.anthropic.scripted-loopback.jsonl
  epiforge replay LOG --fork-at 3 --backend anthropic   # needs ANTHROPIC_API_KEY
  epiforge replay LOG --fork-at 3 --backend openai --base-url http://127.0.0.1:8000/v1 --model qwen2.5-coder
"""

_ABLATE_EXAMPLES = """\
environment:
  ANTHROPIC_API_KEY    the key of --backend anthropic (required); ANTHROPIC_BASE_URL: its API URL
  OPENAI_API_KEY       the key of --backend openai (a local server needs none); OPENAI_BASE_URL: its URL
  EPIFORGE_DATA_DIR    where the sessions' logs go by default: DATA/ablations/<time>/

examples:
  epiforge ablate --task k8 --backend anthropic --runs 5 --concurrency 2 --pack-without operands
  epiforge ablate --task k1 --backend openai --base-url http://127.0.0.1:8000/v1 --model qwen2.5-coder \\
      --pack-without operands --pack-without pitfalls --max-turns 10
  epiforge ablate --from-logs ~/.local/share/epiforge/ablations/20261130T181500Z --report report.json
"""


def add_commands(sub) -> None:
    """Register the agent's subcommands on the epiforge parser (and the demo's options)."""
    demo = sub.choices.get("demo")
    if demo is not None:
        demo.add_argument("--log", default=None, help="the session to replay (default: the example in logs/examples/)")
        demo.add_argument("--experts", action="store_true", help="also evaluate every expert kernel on the CPU (~1 min)")
    fmt = argparse.RawDescriptionHelpFormatter
    backends = "{anthropic,openai,command}"
    p = sub.add_parser("generate", help="let an LLM backend write a kernel for a task", formatter_class=fmt,
                       usage=f"%(prog)s --task TASK --backend {backends} [options]\n"
                             "       %(prog)s --resume LOG [options]\n"
                             f"       %(prog)s --task TASK --backend {backends} --runs N [--concurrency C] [options]",
                       description="Run one agent session: the model writes a kernel for the task, the evaluator "
                                   "checks it, until it passes or a budget is spent.", epilog=_GENERATE_EXAMPLES)
    p.add_argument("--task", help="task id or name, e.g. k8 (required, unless --resume)")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"], help="the LLM backend (required, unless --resume)")
    _backend_options(p)
    _session_options(p)
    p.add_argument("--resume", metavar="LOG", help="continue a killed session, or one that ended on a backend error, "
                                                  "from its log (appends to it; default: start a new session)")
    p.add_argument("--runs", type=int, default=None, metavar="N",
                   help="N independent sessions of the task for pass@k, each with its own session id, log, kernel "
                        "and budgets (--max-turns, --budget-usd, --max-tokens, --max-wall-s apply to each run); "
                        "ends with a summary and pass@1..pass@N. Exit 0 when a run passed, 1 when none did, 2 when "
                        "a run is left to --resume (default: one session, no summary)")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="with --runs: at most C sessions at a time (default: 1)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="with --runs: each run a Ray task on a cluster's worker (agent/runs.py), retried where its "
                        "worker dies by resuming its log; ADDRESS a running cluster's, none: a local one started for "
                        "the runs. --log-dir must be storage every node sees. Needs pip install 'epiforge[ray]' "
                        "(default: the runs on this machine)")
    _output_options(p)
    p.add_argument("--json", action="store_true", help="print the session_ended event as JSON on stdout (with --runs: "
                                                       "one object, the runs and pass@k); progress goes to stderr")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("replay", help="re-run a recorded session offline (or fork it into a live backend)",
                       formatter_class=fmt,
                       usage=f"%(prog)s LOG [--log-dir DIR] [--json] [options]\n"
                             f"       %(prog)s LOG --fork-at N --backend {backends} [options]", epilog=_REPLAY_EXAMPLES)
    p.add_argument("log", help="a session log (JSONL)")
    p.add_argument("--fork-at", type=int, default=None, metavar="N", help="replay steps < N, then continue live "
                                                                         "(default: replay every step)")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"],
                   help="the live backend of a fork (required with --fork-at)")
    _backend_options(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="override the recorded sm_90a cross-compile setting (default: as recorded)")
    p.add_argument("--max-turns", type=int, default=None, help="a fork's turn budget (default: as recorded)")
    p.add_argument("--docs-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--log-dir", default=None, help="where the new log goes (default: DATA/replays/, forks: "
                                                   "DATA/sessions/; DATA: $EPIFORGE_DATA_DIR, else "
                                                   "$XDG_DATA_HOME/epiforge, else ~/.local/share/epiforge)")
    p.add_argument("--out", default=None, metavar="DIR", help="where a fork's passing kernel goes (default: "
                                                             "DATA/kernels/, or LOG_DIR/generated_kernels for a "
                                                             "--log-dir outside the repository and DATA; "
                                                             "generated_kernels: the committed track)")
    p.add_argument("--json", action="store_true", help="print the replay report as JSON on stdout")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("ablate", help="knowledge-pack ablation: runs with and without pages, and a report",
                       formatter_class=fmt,
                       usage=f"%(prog)s --task TASK --backend {backends} --pack-without DOC [--pack-without DOC ...] "
                             "[--runs N] [options]\n"
                             "       %(prog)s --from-logs DIR [--report PATH] [--json]",
                       epilog=_ABLATE_EXAMPLES)
    p.add_argument("--task", help="task id or name (required, unless --from-logs)")
    p.add_argument("--backend", choices=["anthropic", "openai", "command"], help="the LLM backend (required, unless --from-logs)")
    _backend_options(p)
    _session_options(p, pack_without="a primitive_docs page to ablate: each run with the full pack is matched by "
                                     "runs without this page (repeatable; at least one required, unless --from-logs)")
    p.add_argument("--runs", type=int, default=3, help="sessions per condition (default: 3)")
    p.add_argument("--concurrency", type=int, default=None, metavar="C",
                   help="at most C sessions at a time, each with its own backend, log and budgets (default: 1)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="the sessions as Ray tasks on a cluster (as generate --runs --ray); --log-dir must be "
                        "storage every node sees. Needs pip install 'epiforge[ray]' (default: the sessions on this "
                        "machine)")
    p.add_argument("--from-logs", metavar="DIR", default=None, help="only report, from the session logs in DIR "
                                                                    "(default: run the sessions, then report)")
    p.add_argument("--log-dir", default=None, help="where the sessions' logs go (default: DATA/ablations/<time>/; "
                                                   "DATA: $EPIFORGE_DATA_DIR, else $XDG_DATA_HOME/epiforge, else "
                                                   "~/.local/share/epiforge)")
    p.add_argument("--report", default=None, metavar="PATH", help="also write the report as JSON here "
                                                                   "(default: stdout only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.set_defaults(func=cmd_ablate)

    s = sub.add_parser("sessions", help="list or show agent sessions from their logs").add_subparsers(
        dest="sessions_command", required=True)
    p = s.add_parser("list", help="one line per session: outcome, turns, tokens, dollars, kernel",
                     formatter_class=fmt, epilog="examples:\n  epiforge sessions list\n"
                     "  epiforge sessions list --log-dir /tmp/runs --log-dir ~/.local/share/epiforge/ablations/"
                     "20261130T181500Z\n  epiforge sessions list --json\n")
    p.add_argument("--log-dir", action="append", default=None, metavar="DIR",
                   help="a folder of session logs (repeatable; default: DATA/sessions/, DATA: $EPIFORGE_DATA_DIR, "
                        "else $XDG_DATA_HOME/epiforge, else ~/.local/share/epiforge)")
    p.add_argument("--json", action="store_true", help="print the sessions as JSON on stdout")
    p.set_defaults(func=cmd_sessions_list)
    p = s.add_parser("show", help="one session in full: configuration, steps, evaluations, outcome",
                     formatter_class=fmt, epilog="examples:\n  epiforge sessions show 20261130T181500Z-k1-3f9a2c\n"
                     "  epiforge sessions show 20261130T181500Z-k1-3f9a2c --log-dir /tmp/runs --json\n"
                     "  epiforge sessions show ~/.local/share/epiforge/sessions/20261130T181500Z-k1-3f9a2c.jsonl\n")
    p.add_argument("session", help="a session id (looked up in --log-dir) or a log's path")
    p.add_argument("--log-dir", action="append", default=None, metavar="DIR",
                   help="a folder of session logs (repeatable; default: DATA/sessions/, DATA: $EPIFORGE_DATA_DIR, "
                        "else $XDG_DATA_HOME/epiforge, else ~/.local/share/epiforge)")
    p.add_argument("--json", action="store_true", help="print the session as JSON on stdout")
    p.set_defaults(func=cmd_sessions_show)


def _backend_options(p) -> None:
    p.add_argument("--model", default=None, help="model name (anthropic default: claude-sonnet-4-5; openai: required; "
                                                 "command: a label)")
    p.add_argument("--base-url", default=None, help="API base URL (default: $ANTHROPIC_BASE_URL or "
                                                    "https://api.anthropic.com; openai: $OPENAI_BASE_URL)")
    p.add_argument("--command", default=None, help="command backend: the agent CLI to run in the workspace "
                                                   "(required for --backend command)")
    p.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=None,
                   help="command backend: run the agent where it sees its workspace, the Python environment read-only "
                        "and nothing else of the repository, the home or the store (agent/sandbox.py; the default). "
                        "--no-sandbox runs it with the user's whole filesystem, and the log records that")
    p.add_argument("--sandbox-expose", action="append", default=None, metavar="PATH",
                   help="command backend: a path the sandboxed agent may read (its own install, when it lives in the "
                        "home); repeatable; default: none")
    from epiforge.agent.backends import DEFAULT_TIMEOUT_S

    p.add_argument("--timeout", type=float, default=None,
                   help=f"seconds per API request (default: {DEFAULT_TIMEOUT_S['anthropic']:g}; "
                        f"command: per run, default {DEFAULT_TIMEOUT_S['command']:g})")
    p.add_argument("--max-retries", type=int, default=None,
                   help="retries of a failed API request (429, 5xx, overloaded, timeouts), waiting 1, 2, 4 ... "
                        "up to 60 s with jitter, or the server's retry-after (default: 9: an outage of 2 to 4 minutes)")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="stream responses (default: on for anthropic, off for openai)")
    p.add_argument("--max-output-tokens", type=int, default=None,
                   help=f"output tokens per response (default: {DEFAULTS['max_output_tokens']})")


def _session_options(p, pack_without: str = "leave this primitive_docs page out of the knowledge pack "
                                             "(repeatable; default: none)") -> None:
    p.add_argument("--max-turns", type=int, default=None, help=f"model responses (default: {DEFAULTS['max_turns']})")
    p.add_argument("--budget-usd", type=float, default=None,
                   help="dollars over the session, checked before each request (default: no limit; "
                        "an unpriced model needs --price-in and --price-out)")
    p.add_argument("--max-tokens", type=int, default=None, help="input + output tokens over the session (default: no limit)")
    p.add_argument("--max-wall-s", type=float, default=None,
                   help="wall-clock seconds, the knowledge pack's screening before the first request included; it "
                        "also cuts a running check or API request short, and no retry waits past it (default: no limit)")
    p.add_argument("--price-in", type=float, default=None, metavar="USD",
                   help="USD per million input tokens, instead of agent/pricing.py's table (default: the table)")
    p.add_argument("--price-out", type=float, default=None, metavar="USD",
                   help="USD per million output tokens (default: the table)")
    p.add_argument("--pack-without", action="append", default=[], metavar="DOC", help=pack_without)
    p.add_argument("--docs-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="cross-compile every epilogue for sm_90a in checks (default: on)")
    p.add_argument("--device", choices=["auto", "cpu"], default=None,
                   help="auto: also use a Hopper GPU when present (default: auto)")
    p.add_argument("--speed-target", type=float, default=None,
                   help=f"kernel / GEMM-only time to reach on a GPU (default: {DEFAULTS['speed_target']})")


def _output_options(p) -> None:
    p.add_argument("--log-dir", default=None, help="where the session log goes (default: DATA/sessions/; DATA: "
                                                   "$EPIFORGE_DATA_DIR, else $XDG_DATA_HOME/epiforge, else "
                                                   "~/.local/share/epiforge)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where a passing kernel goes, as DIR/<task>/<session>.py (default: DATA/kernels/, or "
                        "LOG_DIR/generated_kernels for a --log-dir outside the repository and DATA; "
                        "--out generated_kernels adds it to the repository's committed track)")
    p.add_argument("--workspace", default=None, help="the session's working directory (default: "
                                                     "DATA/workspaces/ID, or LOG_DIR/workspaces/ID likewise)")


def _die(msg: str, code: int = 2) -> int:
    print(f"epiforge: {msg}", file=sys.stderr)
    return code


def _note(line: str) -> None:
    """A status line that is not the command's output (retries, the pack's screening): stderr."""
    print(line, file=sys.stderr, flush=True)


def _say(args):
    """Progress lines: stdout, or stderr when stdout carries JSON."""
    return _note if getattr(args, "json", False) else print


def _number_problem(args) -> str | None:
    """A flag's number that cannot work, in one line (budgets are checked with the config)."""
    checks = [("max_retries", "--max-retries", 0, "at least 0"), ("max_output_tokens", "--max-output-tokens", 1, "at least 1"),
              ("runs", "--runs", 1, "at least 1"), ("concurrency", "--concurrency", 1, "at least 1"),
              ("max_turns", "--max-turns", 1, "at least 1"),
              ("max_tokens", "--max-tokens", 1, "at least 1")]
    for name, flag, low, words in checks:
        value = getattr(args, name, None)
        if value is not None and value < low:
            return f"{flag} must be {words} (got {value})"
    for name, flag in (("timeout", "--timeout"), ("budget_usd", "--budget-usd"), ("max_wall_s", "--max-wall-s"),
                       ("speed_target", "--speed-target")):
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            return f"{flag} must be more than 0 (got {value:g})"
    for name, flag in (("price_in", "--price-in"), ("price_out", "--price-out")):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            return f"{flag} must not be negative (got {value:g})"
    return None


def _live_backend(args, name: str | None = None, *, model=None, base_url=None, command=None, max_output_tokens=None,
                  stream=None, note=None, sandbox=None, sandbox_expose=None):
    """The live backend the options name; the keyword arguments fill options left unset
    (`note`: where the backend reports retries; default: stderr)."""
    from epiforge.agent.backends import BackendError, RetryPolicy, make_backend

    backend = name or args.backend
    api_only = [flag for flag, value in (("--base-url", args.base_url), ("--stream", args.stream),
                                         ("--max-retries", args.max_retries)) if value is not None]
    if backend == "command" and api_only:  # an option the backend would ignore is refused, not dropped
        raise BackendError(f"{', '.join(api_only)}: options of the API backends; --backend command runs a local command")
    if backend != "command":
        given = [flag for flag, value in (("--command", args.command), ("--sandbox / --no-sandbox", args.sandbox),
                                          ("--sandbox-expose", args.sandbox_expose)) if value is not None]
        if given:
            raise BackendError(f"{', '.join(given)}: for --backend command, not {backend}")
    retry = RetryPolicy() if args.max_retries is None else RetryPolicy(max_retries=args.max_retries)
    return make_backend(backend, model=args.model or model, base_url=args.base_url or base_url,
                        command=args.command or command,
                        max_output_tokens=args.max_output_tokens or max_output_tokens or DEFAULTS["max_output_tokens"],
                        timeout_s=args.timeout, stream=_pick(args.stream, stream), retry=retry,
                        note=note or _note, sandbox=_pick(args.sandbox, _pick(sandbox, True)),
                        sandbox_expose=args.sandbox_expose or sandbox_expose or [])


def _pick(value, default):
    return default if value is None else value


def _config(args):
    from epiforge.agent.session import Budget, SessionConfig

    budget = Budget(max_turns=_pick(args.max_turns, DEFAULTS["max_turns"]), max_tokens=args.max_tokens,
                    max_usd=args.budget_usd, max_wall_s=args.max_wall_s)
    return budget, lambda backend: SessionConfig(
        task=args.task, backend=backend.name, model=backend.model, base_url=getattr(backend, "base_url", None),
        budget=budget, compile=_pick(args.compile, DEFAULTS["compile"]), device=_pick(args.device, DEFAULTS["device"]),
        speed_target=_pick(args.speed_target, DEFAULTS["speed_target"]), pack_without=list(args.pack_without),
        max_output_tokens=_pick(args.max_output_tokens, DEFAULTS["max_output_tokens"]), command=args.command,
        sandbox=getattr(backend, "sandbox", None), sandbox_expose=list(getattr(backend, "expose", [])),
        price_in=args.price_in, price_out=args.price_out)


def resumed_config(args, recorded):
    """The recorded configuration with this command's flags (and, for the base URL, its
    environment) over it, and one line per setting saying which value is used and whence."""
    lines, update, budget = [], {}, {}
    env = BASE_URL_ENV.get(recorded.backend)
    settings = [  # (field, flag, where it lives)
        ("model", "--model", update), ("base_url", "--base-url", update), ("command", "--command", update),
        ("max_turns", "--max-turns", budget), ("max_tokens", "--max-tokens", budget),
        ("max_usd", "--budget-usd", budget), ("max_wall_s", "--max-wall-s", budget),
        ("price_in", "--price-in", update), ("price_out", "--price-out", update),
        ("compile", "--compile", update), ("device", "--device", update), ("speed_target", "--speed-target", update),
        ("max_output_tokens", "--max-output-tokens", update), ("pack_without", "--pack-without", update),
        ("sandbox", "--sandbox", update), ("sandbox_expose", "--sandbox-expose", update),
    ]
    for field, flag, into in settings:
        old = getattr(recorded.budget if into is budget else recorded, field)
        given = getattr(args, {"max_usd": "budget_usd"}.get(field, field), None)
        if field == "pack_without":
            given = list(given) if given else None  # none given: the log's pages stay out
        if given is not None:
            value, source = given, flag
        elif field == "base_url" and env and os.environ.get(env):
            value, source = os.environ[env], env
        else:
            value, source = old, "the log"
        if source != "the log" and value != old:
            source += f"; the log had {old}"
        if value is not None or old is not None:
            lines.append(f"resume: {field.replace('_', ' ')} = {value} (from {source})")
        into[field] = value
    if getattr(args, "docs_dir", None):
        lines.append(f"resume: docs dir = {args.docs_dir} (from --docs-dir; the log records only the pack's pages)")
    config = recorded.model_copy(update=update | {"budget": recorded.budget.model_copy(update=budget)})
    return config, lines


def resumed_backend(args, backend: str, recorded_stream: bool | None = None):
    """The backend settings a log does not hold in its configuration (retries, timeout;
    streaming lives in the start's backend_info), as this resume uses them: (stream to pass
    on, or None for the backend's default; one "resume: ..." line per setting)."""
    from epiforge.agent.backends import DEFAULT_STREAM, DEFAULT_TIMEOUT_S, RetryPolicy

    lines = []
    if backend in DEFAULT_STREAM:
        source = "--max-retries" if args.max_retries is not None else "the default; the log does not record it"
        lines.append(f"resume: max retries = {_pick(args.max_retries, RetryPolicy().max_retries)} (from {source})")
    source = "--timeout" if args.timeout is not None else "the default; the log does not record it"
    lines.append(f"resume: timeout = {_pick(args.timeout, DEFAULT_TIMEOUT_S[backend]):g} s (from {source})")
    stream = None
    if backend in DEFAULT_STREAM:
        if args.stream is not None:
            stream, source = args.stream, "--stream" if args.stream else "--no-stream"
            if recorded_stream is not None and recorded_stream != args.stream:
                source += f"; the log had {recorded_stream}"
        elif recorded_stream is not None:
            stream, source = recorded_stream, "the log"
        else:
            source = "the backend's default"
        shown = stream if stream is not None else DEFAULT_STREAM[backend]
        lines.append(f"resume: stream = {shown} (from {source})")
    return stream, lines


def cmd_generate(args) -> int:
    from epiforge.agent.backends import BackendError
    from epiforge.agent.loop import KernelNotSaved
    from epiforge.agent.session import ConfigError, LogError
    from epiforge.cli import os_error_line
    from epiforge.eval.judge_zygote import warm_judges

    warm_judges()  # many evaluations in this process: each judge forked warm (eval/judge_zygote.py)
    problem = _number_problem(args)
    if problem:
        return _die(problem)
    say = _say(args)
    if args.concurrency is not None and args.runs is None:
        return _die("--concurrency goes with --runs N")
    if args.ray is not None and args.runs is None:
        return _die("--ray goes with --runs N")
    if args.runs is not None:
        return _generate_runs(args, say)
    try:
        if args.resume:
            resumed = _resume(args, say)
            if isinstance(resumed, int):
                return resumed
            end, log = resumed
        else:
            if not (args.task and args.backend):
                return _die("generate needs --task and --backend (or --resume LOG)")
            from epiforge.agent.loop import beside, data_path, run_session
            from epiforge import tasks

            tasks.get_task(args.task)  # an unknown task is one line before any backend is made
            budget, make_config = _config(args)
            problem = budget.problem()
            if problem:
                return _die(problem)
            backend = _live_backend(args)
            log_dir = Path(args.log_dir) if args.log_dir else data_path("sessions")
            try:
                end, log = run_session(make_config(backend), backend, log_dir=log_dir, workspace=args.workspace,
                                     out_dir=_out_dir(args, log_dir), docs_dir=args.docs_dir, say=say,
                                     workspaces=beside(log_dir, "workspaces"), note=_note)
            finally:
                backend.close()
    except (BackendError, ConfigError, LogError, KernelNotSaved) as e:
        return _die(str(e))
    except OSError as e:  # the last resort: the folders were checked before the session began
        return _die(os_error_line(e))
    if args.json:
        print(end.model_dump_json(indent=1))
    if end.outcome == "backend_error":
        return _die(f"{end.reason}; the log is kept: continue with epiforge generate --resume {shlex.quote(str(log))}")
    return 0 if end.outcome in ("passed", "passed_slow") else 1


def _generate_runs(args, say) -> int:
    """--runs N: N sessions, at most --concurrency at a time (agent/runs.py), then the summary."""
    from epiforge.agent.backends import BackendError
    from epiforge.agent.loop import config_problem, data_path
    from epiforge.agent.runs import PASSED, render, run_sessions
    from epiforge.agent.session import ConfigError
    from epiforge.cli import os_error_line
    from epiforge import tasks

    if args.resume:
        return _die("--runs starts new sessions; --resume continues one (resume each run's log on its own)")
    if args.ray is not None:
        if args.concurrency:
            return _die("--concurrency is for runs on this machine; on --ray the cluster's CPUs decide")
        from epiforge.eval.cluster import import_ray

        try:
            import_ray()
        except ValueError as e:
            return _die(str(e))
    if not (args.task and args.backend):
        return _die("generate needs --task and --backend")
    if args.workspace:
        return _die("--workspace names one session's folder; with --runs each run gets DATA/workspaces/ID "
                    "(LOG_DIR/workspaces/ID for a --log-dir outside the repository and DATA)")
    tasks.get_task(args.task)
    budget, make_config = _config(args)
    problem = budget.problem()
    if problem:
        return _die(problem)
    try:
        probe = _live_backend(args)  # a missing key or option is one line, before any run
        config = make_config(probe)
        probe.close()
        problem = config_problem(config)
        if problem:
            return _die(problem)
        log_dir = Path(args.log_dir) if args.log_dir else data_path("sessions")
        rep = run_sessions(config, lambda note: _live_backend(args, note=note), runs=args.runs,
                           concurrency=args.concurrency or 1, log_dir=log_dir, out_dir=_out_dir(args, log_dir),
                           docs_dir=args.docs_dir, say=say, note=_note, ray=args.ray)
    except (BackendError, ConfigError) as e:
        return _die(str(e))
    except OSError as e:  # the last resort: the folders were checked before the runs began
        return _die(os_error_line(e))
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(render(rep))
    if rep["interrupted"]:
        return _die("interrupted", 130)
    if rep["to_resume"]:
        return _die(f"{len(rep['to_resume'])} of {len(rep['runs'])} runs did not finish: continue each with "
                    + "; ".join(f"epiforge generate --resume {shlex.quote(str(log))}" for log in rep["to_resume"]))
    return 0 if any(r["outcome"] in PASSED for r in rep["runs"]) else 1


def _resume(args, say):
    """Resume args.resume with this command's flags and environment over the log's settings:
    (its end, the log's path), or the exit code of a refusal."""
    from epiforge.agent.loop import resume_session
    from epiforge.agent.session import read_events
    from epiforge.agent.transcript import rebuild

    if args.task or args.backend:
        return _die("--resume continues the logged session: its task and backend are the log's (drop --task/--backend)")
    state = rebuild(read_events(Path(args.resume))[0])
    recorded = state.config
    if recorded.backend == "replay":
        return _die(f"{args.resume} is a replay: run epiforge replay on its recording again instead")
    if state.ended is not None and state.ended.outcome != "backend_error":  # before the settings are listed
        return _die(f"{args.resume}: the session already ended ({state.ended.outcome}); only a session that ended "
                    "on a backend error can be resumed: replay or fork it instead")
    config, lines = resumed_config(args, recorded)
    problem = config.budget.problem()
    if problem:
        return _die(problem)
    stream, more = resumed_backend(args, config.backend, state.start.backend_info.get("stream"))
    for line in lines + more:
        say(line)
    backend = _live_backend(args, config.backend, model=config.model, base_url=config.base_url, command=config.command,
                            max_output_tokens=config.max_output_tokens, stream=stream, sandbox=config.sandbox,
                            sandbox_expose=config.sandbox_expose)
    try:
        return resume_session(Path(args.resume), backend, config=config, workspace=args.workspace,
                              out_dir=Path(args.out) if args.out else None, docs_dir=args.docs_dir, say=say,
                              note=_note)
    finally:
        backend.close()


def _out_dir(args, log_dir: Path) -> Path:
    """--out, else beside the log folder (agent/loop.py beside): the data directory's kernels/,
    never the repository's generated_kernels/ unless --out names it."""
    from epiforge.agent.loop import beside

    return Path(args.out) if getattr(args, "out", None) else beside(log_dir, "kernels")


def cmd_replay(args) -> int:
    from epiforge.agent.backends import BackendError
    from epiforge.agent.loop import data_path
    from epiforge.agent.replay import replay
    from epiforge.eval.judge_zygote import warm_judges

    warm_judges()  # many evaluations in this process: each judge forked warm (eval/judge_zygote.py)
    if args.fork_at is not None and not args.backend:
        return _die("--fork-at needs --backend: the live backend that continues the session")
    if args.backend and args.fork_at is None:
        return _die("--backend is for forks: add --fork-at N")
    fork_only = [flag for flag, value in (("--max-turns", args.max_turns), ("--out", args.out), ("--model", args.model),
                                          ("--base-url", args.base_url), ("--command", args.command),
                                          ("--timeout", args.timeout), ("--max-retries", args.max_retries),
                                          ("--stream", args.stream), ("--max-output-tokens", args.max_output_tokens))
                 if value is not None]
    if fork_only and args.fork_at is None:  # a replay runs every recorded step with the recorded responses
        return _die(f"{', '.join(fork_only)}: only for a fork (--fork-at N --backend ...); a replay takes every "
                    "recorded step as recorded")
    problem = _number_problem(args)
    if problem:
        return _die(problem)
    from epiforge.agent.loop import KernelNotSaved

    try:
        live = _live_backend(args) if args.backend else None
        log_dir = Path(args.log_dir) if args.log_dir else data_path("sessions" if live else "replays")
        report = replay(Path(args.log), log_dir=log_dir, fork_at=args.fork_at, live=live, docs_dir=args.docs_dir,
                        compile=args.compile, out_dir=_out_dir(args, log_dir) if live else None, say=_say(args),
                        max_turns=args.max_turns)
    except (BackendError, KernelNotSaved) as e:
        return _die(str(e))
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_replay(report)
    if args.fork_at is not None:
        return 0 if report.outcome in ("passed", "passed_slow") else 1
    return 0 if report.reproduced else 1


def print_replay(report, say=print) -> None:
    if report.fork_at is not None:
        say(f"fork of {report.session} at step {report.fork_at}: {report.outcome}; new log {report.new_log}")
    elif report.recorded_outcome is None:  # a log cut off before its session ended
        say(f"replay of {report.session}: the recording has no end (its log stops before the session ended); "
            f"replayed {report.outcome} in {counted(report.steps, 'step')}: NOT REPRODUCED ("
            f"{'its recorded verdicts agree' if not report.divergences else 'and its verdicts diverge'})")
    else:
        verdict = "reproduced" if report.reproduced else "DIVERGED"
        say(f"replay of {report.session}: recorded {report.recorded_outcome}, replayed {report.outcome} "
            f"in {counted(report.steps, 'step')}: {verdict}")
    for d in report.divergences:
        say("  diverges: " + d.line())
    if report.differences:
        say("  tools that answered otherwise than in the recording (the harness changed since; not verdicts):")
    for d in report.differences:
        say("  differs: " + d.line())
    for w in report.warnings:
        say("  note: " + w)


def cmd_ablate(args) -> int:
    import datetime as _dt

    from epiforge.agent.ablate import print_report, report, rows_json, run_ablation
    from epiforge.agent.backends import BackendError
    from epiforge.agent.loop import data_path
    from epiforge.agent.session import ConfigError
    from epiforge.eval.judge_zygote import warm_judges

    warm_judges()  # many evaluations in this process: each judge forked warm (eval/judge_zygote.py)
    if args.report:  # before any session runs: a report that cannot be written must not cost them
        from epiforge.agent.loop import output_file_problem

        problem = output_file_problem("--report", Path(args.report))
        if problem:
            return _die(problem)
    if args.from_logs:
        logs = sorted(Path(args.from_logs).glob("*.jsonl"))
        if not logs:
            return _die(f"no session logs (*.jsonl) in {args.from_logs}")
    else:
        if not (args.task and args.backend and args.pack_without):
            return _die("ablate needs --task, --backend and at least one --pack-without DOC (or --from-logs DIR)")
        problem = _number_problem(args)
        if problem:
            return _die(problem)
        if args.ray is not None:
            if args.concurrency:
                return _die("--concurrency is for sessions on this machine; on --ray the cluster's CPUs decide")
            from epiforge.eval.cluster import import_ray

            try:
                import_ray()
            except ValueError as e:
                return _die(str(e))
        from epiforge import tasks

        tasks.get_task(args.task)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        log_dir = Path(args.log_dir) if args.log_dir else data_path("ablations") / stamp
        try:
            probe = _live_backend(args)  # a missing key or option fails here, before any run
            _, make_config = _config(args)
            config = make_config(probe).model_copy(update={"pack_without": []})
            probe.close()
            logs = run_ablation(config, lambda: _live_backend(args), pages=args.pack_without, runs=args.runs,
                                log_dir=log_dir, docs_dir=args.docs_dir, say=_say(args),
                                concurrency=args.concurrency or 1, ray=args.ray)
        except (BackendError, ConfigError) as e:
            return _die(str(e))
    rows = report(logs, warn=lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps(rows_json(rows), indent=1))
    else:
        print_report(rows)
    if args.report:  # after the report is printed: a file that fails now loses nothing
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(rows_json(rows), indent=1) + "\n")
    return 0


# ---- sessions ---------------------------------------------------------------------------


def _log_dirs(args) -> list[Path]:
    from epiforge.agent.loop import data_path

    return [Path(d) for d in args.log_dir] if args.log_dir else [data_path("sessions")]


def cmd_sessions_list(args) -> int:
    from epiforge.agent.sessions import summarize

    rows, skipped = [], []
    for d in _log_dirs(args):
        if not d.is_dir():
            if not args.log_dir:
                continue  # the data directory before any session: no sessions
            return _die(f"--log-dir {d}: not a directory")
        for path in sorted(d.glob("*.jsonl")):
            row = summarize(path)
            (rows.append(row) if isinstance(row, dict) else skipped.append(row))
    for why in skipped:
        print(f"epiforge: skipped {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no sessions in " + ", ".join(str(d) for d in _log_dirs(args)))
        return 0
    print(f"{'session':34} {'task':34} {'backend / model':36} {'outcome':17} {'turns':>5} {'tokens':>9} {'$':>8}  kernel")
    for r in rows:
        cost = "unpriced" if r["cost_usd"] is None else f"{r['cost_usd']:.4f}"
        print(f"{r['session']:34} {r['task']:34} {r['backend'] + ' / ' + r['model']:36} {r['outcome']:17} "
              f"{r['turns']:>5} {r['tokens']:>9} {cost:>8}  {r['kernel'] or '-'}")
    return 0


def cmd_sessions_show(args) -> int:
    from epiforge.agent.sessions import describe_session, find_log

    path = find_log(args.session, _log_dirs(args))
    text, data = describe_session(path)
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        print(text)
    return 0
