"""The model's tools: read_doc, list_examples, read_example, write_kernel, run_check,
run_benchmark, submit. Every kernel goes through eval.evaluate (an isolated subprocess):
the harness never imports generated code; it reads a kernel's metadata with the AST only.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from epiforge.agent.backends.base import ToolSpec
from epiforge.agent.feedback import describe, plain, scrub, scrub_tree, speed_ratio
from epiforge.agent.session import BestKernel, Evaluation, ToolResultBlock, ToolUseBlock
from epiforge.eval.machine import hopper_available

MAX_SOURCE_BYTES = 200_000

TOOLS = [
    ToolSpec("read_doc", "Read one page of the knowledge pack (primitive_docs) by name, e.g. 'index'.",
             {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
    ToolSpec("list_examples", "List the expert kernels of other tasks you may read.",
             {"type": "object", "properties": {}}),
    ToolSpec("read_example", "Read the expert kernel of another task (by id, e.g. 'k2', or full name).",
             {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}),
    ToolSpec("write_kernel", "Write (replace) your kernel file with the complete Python source.",
             {"type": "object", "properties": {"source": {"type": "string"}}, "required": ["source"]}),
    ToolSpec("run_check", "Evaluate the current kernel: CPU emulator numerics on the smoke shapes, the sm_90a "
             "cross-compile, and the GPU when this machine has one. Returns the verdict and the worst mismatch.",
             {"type": "object", "properties": {"compile": {"type": "boolean", "description": "cross-compile for sm_90a (default: the session's setting)"}}}),
    ToolSpec("run_benchmark", "Time the current kernel on the GPU against the GEMM alone (needs a GPU).",
             {"type": "object", "properties": {"shapes": {"type": "string", "enum": ["smoke", "paper"]}}}),
    ToolSpec("submit", "Submit the current kernel as final. The session ends when it passes (and, on a GPU, "
             "meets the speed target); otherwise you get the feedback and may continue.",
             {"type": "object", "properties": {}}),
]
TOOL_NAMES = [t.name for t in TOOLS]

#: how good an outcome is when choosing the best kernel of a session (higher is better)
_RANK = {"PASSED": 3, "INCORRECT_NUMERICS": 2, "INCORRECT_SHAPE": 1, "INCORRECT_DTYPE": 1}


class ToolFailure(Exception):
    """A tool call the model got wrong: its message goes back as an error result."""


def check_timeout_s(task, device: str, shapes: str, compile_: bool, precisions: int | None = None) -> float:
    """How long one evaluation of a kernel for `task` may take before it is killed: a start-up
    allowance, the numerics at a slow emulator's (or GPU's) pace over the GEMM work of the
    shape set in each precision judged (default: every one the task lists), and on a CPU
    with the sm_90a cross-compile, two minutes per GEMM launch. A k1 check on two CPU cores
    takes ~4 s (~12 s with the compile) per precision; this allows ~200 s."""
    from epiforge import tasks

    n = len(task.dtypes) if precisions is None else precisions
    gflop = n * sum(task.flops(s.dims()) for s in tasks.shape_sets()[shapes]) / 1e9
    if device == "cuda":
        return round(300 + 0.03 * gflop)
    return round(60 + 30 * gflop + (120 * task.gemm_count if compile_ else 0))


def bounded_timeout(limit_s: float, left_s: float | None) -> tuple[float, bool]:
    """One evaluation's timeout: its own limit, or the wall time the session has left when
    that is shorter (at least 1 s); and whether the wall time set it."""
    by_wall = left_s is not None and left_s < limit_s
    return (max(1.0, left_s) if by_wall else limit_s), by_wall


def wall_timeout_message(message: str, limit_s: float) -> str:
    """A TIMEOUT's message when the session's wall time, not the kernel's limit, cut it short."""
    return message + f" (the session's wall-time budget ran out; the kernel's own limit was {limit_s:.0f} s)"


class Heartbeat:
    """A context manager whose beat() runs `first_s` seconds after it is entered, then every
    `every_s` seconds, until it exits (a thread of its own): a long wait is never silence."""

    def __init__(self, first_s: float, every_s: float):
        self.first_s, self.every_s, self.t0 = first_s, every_s, time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def beat(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        wait = self.first_s
        while not self._done.wait(wait):
            self.beat()
            wait = self.every_s


class Progress(Heartbeat):
    """Says each stage of a running evaluation as it starts, and every `every_s` seconds that
    it is still running, so a slow or hanging kernel is never silence."""

    def __init__(self, say, label: str, limit_s: float, every_s: float = 15.0):
        super().__init__(every_s, every_s)
        self.say, self.label, self.limit_s = say, label, limit_s
        self.stage_name = "starting"
        self._said: set[str] = set()

    def stage(self, name: str) -> None:
        """A stage starts; said the first time (the judge repeats compile and numerics per shape)."""
        self.stage_name = name
        if name not in self._said:
            self._said.add(name)
            self.say(f"{self.label}: {name} ({self.elapsed():.0f} s)")

    def beat(self) -> None:
        self.say(f"{self.label}: still in {self.stage_name}, {self.elapsed():.0f} s of at most {self.limit_s:.0f} s")


@dataclass
class ToolBox:
    task: object  # tasks.Task
    pack: object  # agent.pack.Pack
    workspace: Path
    config: object  # agent.session.SessionConfig
    session_id: str
    record: callable  # writes one event to the session log
    sources: dict[str, str] = field(default_factory=dict)  # sha256 -> source of every kernel written
    current: str | None = None  # sha256 of the kernel in the workspace
    best: BestKernel | None = None
    finished: str | None = None  # "passed" once a submitted kernel passed and was fast enough
    passed_how: str = ""  # how it passed: on the CPU only (provisional), or on the GPU and how fast
    slow_pass: str | None = None  # sha256 of a correct kernel that missed the speed target
    evaluations: int = 0
    last: Evaluation | None = None  # the latest evaluation event (progress lines)
    seeds: dict = field(default_factory=dict)  # (step, call_id, device, shapes) -> seed: a replay reuses the recorded ones
    say: Callable[[str], None] = lambda line: None  # progress lines of running evaluations
    time_left: Callable[[], float | None] = lambda: None  # seconds the wall-time budget has left (None: no limit)
    _cache: dict = field(default_factory=dict)  # (sha, device, shapes, compile) -> (step, Result, seed)

    @property
    def kernel_path(self) -> Path:
        return self.workspace / "kernel.py"

    def gpu(self) -> bool:
        return self.config.device == "auto" and hopper_available()

    def run(self, call: ToolUseBlock, step: int) -> ToolResultBlock:
        args = dict(call.input or {})
        try:
            if "__invalid_json__" in args:
                raise ToolFailure(f"the arguments were not valid JSON: {args['__invalid_json__']}")
            handler = getattr(self, f"_tool_{call.name}", None) if call.name in TOOL_NAMES else None
            if handler is None:
                raise ToolFailure(f"no tool named {call.name!r}; tools: {', '.join(TOOL_NAMES)}")
            text = handler(args, step=step, call_id=call.id)
            return ToolResultBlock(tool_use_id=call.id, content=plain(text))
        except ToolFailure as e:
            return ToolResultBlock(tool_use_id=call.id, content=plain(str(e)), is_error=True)

    # ---- knowledge ---------------------------------------------------------------------

    def _tool_read_doc(self, args, **_):
        name = _string(args, "name")
        doc = self.pack.doc(name)
        if doc is None:
            names = ", ".join(d.name for d in self.pack.docs) or "(no pages on this machine)"
            raise ToolFailure(f"no page {name!r}; pages: {names}")
        return doc.text

    def _tool_list_examples(self, args, **_):
        lines = []
        from epiforge.agent.pack import task_order

        for name in sorted(self.pack.examples, key=task_order):
            first = self.pack.examples[name].strip().strip('"').splitlines()[0].strip('"')
            lines.append(f"{name}: {first}")
        return "\n".join(lines) or "no examples"

    def _tool_read_example(self, args, **_):
        name = _string(args, "task")
        if name in (self.task.id, self.task.name, self.task.name + ".py"):
            raise ToolFailure("that is the task you are solving: its expert kernel is not available")
        hit = self.pack.example(name)
        if hit is None:
            raise ToolFailure(f"no example {name!r}; examples: {', '.join(self.pack.examples)}")
        return f"# {hit[0]}.py\n{hit[1]}"

    # ---- the kernel --------------------------------------------------------------------

    def _tool_write_kernel(self, args, **_):
        """Write the kernel and run the evaluator's static stage on it at once (parsing only:
        nothing of it runs), so a kernel that a check would reject unrun hears so now."""
        from epiforge.eval.evaluation import static_stage
        from epiforge.eval.kernel import read_kernel
        from epiforge.eval.result import Result

        source = _string(args, "source")
        if len(source.encode()) > MAX_SOURCE_BYTES:
            raise ToolFailure(f"the source is over {MAX_SOURCE_BYTES} bytes")
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.kernel_path.write_text(source, encoding="utf-8")
        sha = hashlib.sha256(source.encode()).hexdigest()
        self.sources[sha], self.current = source, sha
        base = dict(task=self.task.name, kernel="kernel.py", kernel_sha256=sha, device="cpu", shapes="smoke")
        static = static_stage(self.task, self.kernel_path, source, base, static_checks=True)
        lines = source.count("\n") + 1
        if isinstance(static, Result):
            raise ToolFailure(f"wrote kernel.py ({lines} lines), but the static checks reject it "
                              f"({static.outcome.value}; nothing ran): {scrub(static.message, self.workspace)}")
        meta = read_kernel(self.kernel_path, track="candidate", source=source)
        return (f"wrote kernel.py ({lines} lines, sha256 {sha[:12]}); the static checks pass (TASK ok; prepare(): "
                f"{'yes' if meta.has_prepare else 'no'}). Next: run_check.")

    def _need_kernel(self) -> str:
        if self.current is None:
            raise ToolFailure("no kernel yet: call write_kernel first")
        return self.current

    def _tool_run_check(self, args, *, step, call_id):
        sha = self._need_kernel()
        compile_ = args.get("compile", self.config.compile)
        if not isinstance(compile_, bool):
            raise ToolFailure("compile must be true or false")
        result, text = self._evaluate(sha, "check", "cpu", "smoke", compile_, step, call_id)
        if result.passed and self.gpu():
            _, gpu_text = self._evaluate(sha, "check", "cuda", "smoke", False, step, call_id)
            text += "\n\n" + gpu_text
        elif not self.gpu() and result.stage != "static":
            text += "\n(no Hopper GPU on this machine: numerics were checked on the CPU emulator only)"
        return text

    def _tool_run_benchmark(self, args, *, step, call_id):
        sha = self._need_kernel()
        shapes = args.get("shapes", "paper")
        if shapes not in ("smoke", "paper"):
            raise ToolFailure("shapes must be 'smoke' or 'paper'")
        if not self.gpu():
            return ("no GPU available on this machine: nothing was timed (times are never estimated here). "
                    "Correctness is checked by run_check; the speed is measured on a Hopper GPU.")
        result, text = self._evaluate(sha, "benchmark", "cuda", shapes, False, step, call_id)
        ratio = speed_ratio(result)
        if result.passed and ratio is None:
            text += "\n(the evaluator reported no timing for these shapes)"
        return text

    def _tool_submit(self, args, *, step, call_id):
        sha = self._need_kernel()
        result, text = self._evaluate(sha, "submit", "cpu", "smoke", self.config.compile, step, call_id)
        if not result.passed:
            return "not accepted.\n" + text
        if not self.gpu():
            self.finished = "passed"
            self.passed_how = ("provisionally: correct on the CPU emulator" + (" and compiles for sm_90a" if self.config.compile
                                                                              else "")
                               + "; not yet run on a GPU, so neither final nor timed (no GPU on this machine)")
            return f"accepted, {self.passed_how}.\n" + text
        result, gpu_text = self._evaluate(sha, "submit", "cuda", "paper", False, step, call_id)
        text += "\n\n" + gpu_text
        if not result.passed:
            return "not accepted (failed on the GPU).\n" + text
        ratio = speed_ratio(result)
        if ratio is not None and ratio > self.config.speed_target:
            self.slow_pass = sha
            return (f"correct but too slow: {ratio:.3f} x GEMM-only > target {self.config.speed_target}; "
                    "make the epilogue cheaper and submit again.\n" + text)
        self.finished = "passed"
        timed = f"{ratio:.3f} x GEMM-only" if ratio is not None else "no timing reported"
        self.passed_how = f"correct on CPU and GPU; {timed}"
        return f"accepted: {self.passed_how}.\n" + text

    # ---- evaluation ----------------------------------------------------------------------

    def _evaluate(self, sha, purpose, device, shapes, compile_, step, call_id):
        """evaluate() the workspace kernel (or reuse a passing result of the same kernel and
        settings from this session), log an Evaluation event, return (Result, feedback)."""
        from epiforge.eval import KernelError, evaluate

        key = (sha, device, shapes, compile_)
        cached = self._cache.get(key)
        if cached and cached[1].passed:
            prev_step, result, seed = cached
            reused = prev_step
        else:
            seed = self.seeds.get((step, call_id, device, shapes), secrets.randbelow(2**31))
            reused = None
            limit = check_timeout_s(self.task, device, shapes, compile_)
            left = self.time_left()
            if left is not None and left <= 0:
                raise ToolFailure("the session's wall-time budget is spent: the kernel was not evaluated")
            timeout, by_wall = bounded_timeout(limit, left)
            label = f"step {step}: {purpose} ({'GPU' if device == 'cuda' else 'CPU'}, {shapes})"
            try:
                with Progress(self.say, label, timeout) as progress:
                    result = evaluate(self.task.name, self.kernel_path, device=device, shapes=shapes, seed=seed,
                                      compile=compile_, timeout_s=timeout, on_stage=progress.stage)
            except KernelError as e:  # e.g. the file cannot be read any more
                raise ToolFailure(f"the kernel cannot be evaluated: {scrub(str(e), self.workspace)}") from None
            if by_wall and result.outcome.value == "TIMEOUT":
                result = result.model_copy(update={"message": wall_timeout_message(result.message, limit)})
            if result.stage == "static":
                seed = None  # nothing ran: no inputs were drawn
            self._cache[key] = (step, result, seed)
            self.evaluations += 1
        ratio = speed_ratio(result)
        self.last = Evaluation(
            session=self.session_id, step=step, call_id=call_id, purpose=purpose, kernel_sha256=sha, device=device,
            shapes=shapes, compile=compile_, seed=seed, outcome=result.outcome.value,
            message=scrub(result.message, self.workspace), reused_from_step=reused, speed_ratio=ratio,
            result=scrub_tree(result.model_dump(mode="json"), self.workspace),
        )
        self.record(self.last)
        self.best = update_best(self.best, step, sha, result.outcome.value, ratio)
        text = describe(result, what=purpose, workspace=self.workspace)
        if reused is not None:
            text = f"(same kernel and settings as the passing evaluation of step {reused}: result reused)\n" + text
        return result, text



def update_best(best: BestKernel | None, step: int, sha: str, outcome: str, ratio: float | None) -> BestKernel:
    """The better of the session's best kernel so far and a newly evaluated one (a tie goes to the newer)."""
    def score(outcome, ratio):
        return (_RANK.get(outcome, 0), -(ratio or 0.0))

    if best is None or score(outcome, ratio) >= score(best.outcome, best.speed_ratio):
        return BestKernel(step=step, sha256=sha, outcome=outcome, speed_ratio=ratio)
    return best


def _string(args: dict, name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolFailure(f"missing the string argument {name!r}")
    return value
