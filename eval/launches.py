"""Launch provenance: which GPU kernels one run() launched, judged against the task.

A task allows exactly its fused GEMMs (one, "gemm", or each of a task of several,
"gemm:<name>"), each a CuTe-DSL kernel minted by quack's epilogue frontend, plus at most
its named finishing steps (Task.finishing_steps), each one kernel (the built-ins' are
Triton kernels of primitives/finish_gpu.py). Everything must run on the stream the harness
times (a side stream escapes the CUDA events). Pure logic: the GPU stage collects the
names and streams with the torch profiler (eval/gpu_stages.py); tests feed it lists.

The names, pinned from quack 0.6.5 and nvidia-cutlass-dsl 4.7.1 (seen on the H200 in
lab/results/h200/check.json):
  fused GEMM   "kernel_cutlass_kernel_quackepiloguefrontendGemmMod_<epilogue>_<digest>..."
               (CuTe-DSL names a kernel "kernel_cutlass_" + the mangled qualified name of
               its class; quack.epilogue.frontend mints "GemmMod_<fn name>_<digest>_...")
  finishers    "_row_fold" (rstd_from_sumsq, row_sum, cross_entropy), "_col_fold" (col_sum); a
               task's own step, the kernel name it registered (primitives/finish.py)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

CUTE_DSL_PREFIX = "kernel_cutlass_"
FUSED_GEMM_MARK = "quackepiloguefrontendGemmMod_"


def finisher_kernel(step: str) -> str:
    """The kernel name a finishing step launches on the GPU (its registration,
    primitives/finish.py: "_row_fold" / "_col_fold" for the built-ins)."""
    from epiforge.primitives.finish import STEPS

    return STEPS[step].gpu_kernel

#: substrings of cuBLAS / cuBLASLt / CUTLASS-library kernel names (for the message only:
#: any kernel outside the allowance fails, named or not)
CUBLAS_TAGS = ("cublas", "nvjet", "xmma", "sm90_gemm", "sm80_gemm", "cutlass_80", "cutlass_90", "ampere_", "gemv",
               "gemmk1", "splitkreduce")


@dataclass
class Launch:
    name: str
    stream: int | None = None


@dataclass
class LaunchVerdict:
    ok: bool
    message: str
    gemm: list[str] = field(default_factory=list)
    finishers: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)


def is_fused_gemm(name: str) -> bool:
    return name.startswith(CUTE_DSL_PREFIX) and FUSED_GEMM_MARK in name


def is_cublas(name: str) -> bool:
    low = name.lower()
    return any(tag in low for tag in CUBLAS_TAGS)


def short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def allowance(allowed: list[str]) -> tuple[int, list[str]]:
    """task.launches as (how many fused GEMMs, the finishing steps): "gemm" and each
    "gemm:<name>" is one fused GEMM, every other entry one finishing step."""
    from epiforge.tasks.spec import is_gemm_launch

    gemms = [x for x in allowed if is_gemm_launch(x)]
    if not gemms:
        raise ValueError("allowed launches must name a fused GEMM ('gemm' or 'gemm:<name>')")
    return len(gemms), [x for x in allowed if x not in gemms]


def _exactly(n: int) -> str:
    return "exactly one is allowed" if n == 1 else f"exactly {n} are allowed"


def classify(launches: list[Launch], allowed: list[str], stream: int | None = None) -> LaunchVerdict:
    """`launches`: the kernels of one run() in launch order; `allowed`: task.launches (the
    fused GEMMs and finishing-step names); `stream`: the timed stream's id, or None to skip
    the stream check."""
    n_gemms, steps = allowance(allowed)
    budget = Counter(finisher_kernel(f) for f in steps)
    gemm, finishers, extra = [], [], []
    for launch in launches:
        if is_fused_gemm(launch.name):
            gemm.append(launch.name)
        elif budget[launch.name] > 0:
            budget[launch.name] -= 1
            finishers.append(launch.name)
        else:
            extra.append(launch.name)
    names = [short(x.name) for x in launches]
    if stream is not None:
        off = [x.name for x in launches if x.stream is not None and x.stream != stream]
        if off:
            return LaunchVerdict(False, f"{len(off)} launch(es) on another stream than the timed one: "
                                        f"{[short(n) for n in off]}", gemm, finishers, extra)
    if extra:
        cublas = [n for n in extra if is_cublas(n)]
        what = (f"a cuBLAS kernel ({short(cublas[0])}): the GEMM must be the fused CuTe-DSL one" if cublas
                else f"kernels outside the allowance {allowed}: {[short(n) for n in extra]}")
        return LaunchVerdict(False, f"{len(launches)} launches, {what}", gemm, finishers, extra)
    if len(gemm) != n_gemms:
        what = "no fused CuTe-DSL GEMM" if not gemm else f"{len(gemm)} fused GEMMs"
        return LaunchVerdict(False, f"{what} in one run() ({_exactly(n_gemms)}): {names}", gemm, finishers, extra)
    return LaunchVerdict(True, f"{len(launches)} launch(es): {names}", gemm, finishers, extra)


def classify_recorded(launched: list[str], allowed: list[str]) -> tuple[bool, str]:
    """The CPU's launch check: primitives/trace.py's record of one run() ("gemm:<epilogue>",
    "finish:<step>", "prepare:<helper>") against the task's allowance, as classify() judges
    the GPU profiler's kernels: exactly the task's fused GEMMs, the named finishing steps at most
    as often as listed, and no prepare helper (they run in prepare(), once per weights)."""
    gemms = [x.split(":", 1)[1] for x in launched if x.startswith("gemm:")]
    finishes = [x.split(":", 1)[1] for x in launched if x.startswith("finish:")]
    prepares = sorted({x.split(":", 1)[1] for x in launched if x.startswith("prepare:")})
    if prepares:
        return False, (f"run() called P.prepare.{prepares[0]}: prepare helpers are launches of their own; "
                       "call them in prepare(), which runs once per set of weights")
    n_gemms, steps = allowance(allowed)
    budget = Counter(steps)
    extra = []
    for f in finishes:
        if budget[f] > 0:
            budget[f] -= 1
        else:
            extra.append(f)
    if extra:
        return False, (f"finishing steps outside the allowance {allowed}: {extra} (each is a launch; the task "
                       "names the ones it allows)")
    if len(gemms) != n_gemms:
        what = "no fused GEMM" if not gemms else f"{len(gemms)} fused GEMMs ({', '.join(gemms[:4])})"
        return False, f"{what} in one run() ({_exactly(n_gemms)})"
    return True, f"{len(launched)} launch(es): {launched}"
