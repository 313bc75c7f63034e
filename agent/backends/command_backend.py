"""An external coding-agent CLI as the model: one run of the command per turn, in a prepared
workspace; the harness evaluates the kernel it leaves.

The workspace holds PROMPT.md (the rules, the task, how to work here), docs/ (the pack's
pages), examples/ (expert kernels of other tasks), kernel.py (a stub to replace), and an
executable `check` that evaluates kernel.py on the spot. After each run the harness reads
kernel.py: a changed kernel becomes the turn's write_kernel + submit calls (so the log,
replay and fork treat it like any other backend's turn) and the verdict goes to
FEEDBACK.md for the next run.

The command line may use {prompt}, {feedback}, {workspace} and {step}; the prompt (first
turn) or the feedback (later turns) is also on its stdin. It runs in the workspace, inside
agent/sandbox.py's sandbox unless sandbox=False (`--no-sandbox`): it sees the workspace, the
Python environment read-only and nothing else of the repository, the home or the store; a
machine where the sandbox cannot be set up fails at the start, in one line. It gets the
user's environment (the agent CLI needs its own credentials) plus EPIFORGE_* variables,
EPIFORGE_DEADLINE among them: the Unix time at which the run is killed (the backend's timeout,
or the session's wall time left when less), which ./check ends before. While the agent runs,
a line every EVERY_S seconds says so on `note`: a long run is never silence.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from epiforge.agent import sandbox
from epiforge.agent.backends.base import Backend, BackendError, ModelTurn, request_timeout
from epiforge.agent.check import DEADLINE_ENV
from epiforge.agent.feedback import scrub
from epiforge.agent.tools import Heartbeat
from epiforge.agent.session import TextBlock, ToolUseBlock
from epiforge import IMPORT_ROOT

_TAIL = 2000
_CHECKS = ".checks.jsonl"


class CommandBackend(Backend):
    name = "command"
    EVERY_S = 15.0  # how often a running agent is said to be running

    def __init__(self, command: str | None, model: str | None = None, *, timeout_s: float = 1800.0, note=print,
                 sandbox: bool = True, expose=()):
        if not command:
            raise BackendError("command: --command is required (the agent CLI to run in the workspace)")
        try:
            argv = shlex.split(command)
        except ValueError as e:
            raise BackendError(f"command: cannot parse --command: {e}") from None
        exe = argv[0] if argv else ""
        if not (shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK))):
            raise BackendError(f"command: {exe!r} is not an executable on PATH")
        super().__init__(model or "unknown")
        self.command, self.argv, self.timeout_s, self.note = command, argv, timeout_s, note
        self.sandbox, self.expose = bool(sandbox), [str(Path(p).expanduser()) for p in expose]
        self.ctx = None

    def info(self) -> dict:
        return {"backend": self.name, "model": self.model, "command": scrub(self.command), "timeout_s": self.timeout_s,
                "sandbox": self.sandbox, "sandbox_expose": self.expose}

    def _probe_sandbox(self, ws: Path) -> None:
        """The sandbox set up once before the agent runs: where it cannot be, one line and no session."""
        if self.sandbox:
            ok, line = sandbox.available(ws, self.expose)
            if not ok:
                raise BackendError(f"command: the agent's sandbox cannot be set up here: {line}")

    # ---- the workspace -----------------------------------------------------------------

    def start(self, ctx) -> None:
        self.ctx = ctx
        ws = Path(ctx.workspace)
        (ws / "docs").mkdir(parents=True, exist_ok=True)
        (ws / "examples").mkdir(exist_ok=True)
        for doc in ctx.pack.docs:
            path = ws / "docs" / f"{doc.name}.md"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(doc.text, encoding="utf-8")
        for name, source in ctx.pack.examples.items():
            (ws / "examples" / f"{name}.py").write_text(source, encoding="utf-8")
        # the task's page as the workspace has it: its examples are files here, not a tool
        task_prompt = ctx.pack.task_prompt(speed_target=ctx.config.speed_target, examples_hint="examples/<name>.py")
        prompt = ctx.pack.render("workspace.md.j2", task_prompt=task_prompt, speed_target=ctx.config.speed_target)
        (ws / "PROMPT.md").write_text(prompt, encoding="utf-8")
        from epiforge.agent.pack import kernel_stub

        if not (ws / "kernel.py").exists():
            (ws / "kernel.py").write_text(kernel_stub(ctx.task), encoding="utf-8")
        compile_flag = "--compile" if ctx.config.compile else "--no-compile"
        check = ws / "check"
        check.write_text(
            "#!/bin/sh\n# Evaluate ./kernel.py with the epiforge evaluator and print the verdict.\n"
            f'cd "$(dirname "$0")" && PYTHONPATH={shlex.quote(str(IMPORT_ROOT))} exec {shlex.quote(sys.executable)} '
            f"-m epiforge.agent.check --task {shlex.quote(ctx.task.name)} --kernel kernel.py {compile_flag} "
            f'--record {_CHECKS} "$@"\n', encoding="utf-8")
        check.chmod(check.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self._probe_sandbox(ws)

    def ended(self, outcome: str, reason: str) -> None:
        """The session's end, in FEEDBACK.md: an agent that waits for feedback after its round
        learns that no round follows (a pass ends the session, and so does a spent budget). Not
        after a backend error: `generate --resume` continues that session."""
        if self.ctx is None or outcome == "backend_error":
            return
        try:
            (Path(self.ctx.workspace) / "FEEDBACK.md").write_text(
                f"# The session is over: {outcome}\n\n{scrub(reason)}\n\nNo round follows: the harness runs the "
                "agent command no more.\n", encoding="utf-8")
        except OSError:  # a workspace removed under the harness: the log has the end
            pass

    # ---- one turn -------------------------------------------------------------------------

    def complete(self, system, messages, tools, *, step, on_retry=None, time_left=None) -> ModelTurn:
        if self.ctx is None:
            raise BackendError("command: the workspace was not prepared (start() not called)")
        ws = Path(self.ctx.workspace)
        feedback = _feedback(messages) if step > 0 else ""
        if feedback:
            (ws / "FEEDBACK.md").write_text(f"# Harness feedback after round {step}\n\n{feedback}\n", encoding="utf-8")
        stdin = (ws / "PROMPT.md").read_text(encoding="utf-8") if not feedback else feedback
        kernel = ws / "kernel.py"
        before = kernel.read_text(encoding="utf-8") if kernel.exists() else ""
        checks_before = _count_lines(ws / _CHECKS)
        values = {"prompt": str(ws / "PROMPT.md"), "feedback": str(ws / "FEEDBACK.md"), "workspace": str(ws), "step": str(step)}
        argv = [a.format(**values) if "{" in a else a for a in self.argv]
        if self.sandbox:  # the agent's command gets the sandbox's PYTHONPATH too
            argv = sandbox.command(ws, argv, self.expose)
        timeout = request_timeout(self.timeout_s, time_left() if time_left else None)  # never past the wall budget
        env = os.environ | (sandbox.launch_env() if self.sandbox else {}) | {"EPIFORGE_WORKSPACE": str(ws), "EPIFORGE_STEP": str(step), "EPIFORGE_TASK": self.ctx.task.name,
                            DEADLINE_ENV: f"{time.time() + timeout:.3f}"}
        started = time.monotonic()
        try:
            proc = subprocess.Popen(argv, cwd=ws, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as e:
            raise BackendError(f"command: cannot start {argv[0]!r}: {e.strerror}") from None
        try:
            with _AgentRunning(self.note, step, timeout, ws / _CHECKS, checks_before, self.EVERY_S):
                out, err = proc.communicate(stdin, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        seconds = round(time.monotonic() - started, 3)
        after = kernel.read_text(encoding="utf-8") if kernel.exists() else ""
        checks = _read_lines(ws / _CHECKS)[checks_before:]
        status = f"killed after {timeout:.0f} s" if timed_out else f"exit code {proc.returncode}"
        summary = f"[command backend] the agent ran for {seconds:.1f} s ({status}); it ran ./check {len(checks)} time(s)"
        content = [TextBlock(text=summary + (" and left a new kernel.py." if after != before else "; kernel.py is unchanged."))]
        if after != before and after.strip():
            content += [ToolUseBlock(id=f"cmd{step}_write", name="write_kernel", input={"source": after}),
                        ToolUseBlock(id=f"cmd{step}_submit", name="submit", input={})]
        notes = {"exit_code": proc.returncode, "timed_out": timed_out, "seconds": seconds, "checks": checks,
                 "stdout_tail": scrub(out or "", ws)[-_TAIL:], "stderr_tail": scrub(err or "", ws)[-_TAIL:]}
        return ModelTurn(content=content, stop_reason="tool_use" if len(content) > 1 else "end_turn",
                         latency_s=seconds, model=self.model, notes=notes)


class _AgentRunning(Heartbeat):
    """Says every `every_s` seconds that the agent's run goes on, and how often it ran ./check."""

    def __init__(self, note, step: int, limit_s: float, checks: Path, checks_before: int, every_s: float):
        super().__init__(every_s, every_s)
        self.note, self.step, self.limit_s, self.checks, self.checks_before = note, step, limit_s, checks, checks_before

    def beat(self) -> None:
        ran = _count_lines(self.checks) - self.checks_before
        self.note(f"step {self.step}: the agent command is running, {self.elapsed():.0f} s of at most "
                  f"{self.limit_s:.0f} s; it ran ./check {ran} time(s) so far")


def _feedback(messages) -> str:
    """The harness's answer to the previous turn: the last user message's text."""
    last = messages[-1]
    parts = []
    for b in last.content:
        if b.type == "tool_result":
            parts.append(("ERROR: " if b.is_error else "") + b.content)
        elif b.type == "text":
            parts.append(b.text)
    return "\n\n".join(parts)


def _count_lines(path: Path) -> int:
    return len(_read_lines(path))


def _read_lines(path: Path) -> list:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({"unparsed": line[:200]})
    return out
