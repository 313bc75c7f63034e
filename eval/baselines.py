"""The baselines a kernel is timed beside, in one registry: what each computes, for which
tasks, from which library, and how the judge builds it (eval/gpu_stages.py times them in
the same interleaved run as the kernel).

The speed of light ("gemm_only"): the fastest of cuBLAS and quack's identity-epilogue GEMM
(the same mainloop as the fused kernel, nothing fused), at the fused kernel's own tile
config and at the configs that ran fastest for the shape on the H200 (eval/data/
sol-configs.json, written by lab/bench/sol_table.py from lab/results/h200's sweeps).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from epiforge import primitives as P

SOL_TABLE = Path(__file__).resolve().parent / "data" / "sol-configs.json"


@P.epilogue()
def identity_gemm(acc):
    """quack's GEMM with nothing fused: D = acc (the speed-of-light candidate)."""
    return {"D": acc}


@dataclass(frozen=True)
class Baseline:
    name: str
    what: str
    library: str
    tasks: str  # "all", or a note on which
    where: str  # "judge": the evaluator times it (ask for it by name beyond the standard ones); else why not


REGISTRY = {b.name: b for b in (
    Baseline("cublas", "torch.mm of the task's GEMM in its shape and operand layouts", "cuBLAS (torch)", "all", "judge"),
    Baseline("quack_gemm", "quack's SM90 GEMM with an identity epilogue, at a given tile config", "quack 0.6.5", "all",
             "judge"),
    Baseline("gemm_only", "the speed of light: the fastest of cublas and quack_gemm at the kernel's config and at the "
             "shape's fastest known configs", "cuBLAS, quack", "all", "judge"),
    Baseline("eager", "the task's unfused PyTorch reference, eager, in the inputs' precision", "PyTorch", "all", "judge"),
    Baseline("torch_compile", "cuBLAS + torch.compile (Inductor) of the unfused reference", "PyTorch", "all", "judge"),
    Baseline("liger", "cuBLAS + Liger-Kernel's Triton kernels (eval/liger.py)", "liger-kernel 0.8.5",
             "where Liger has the op", "judge"),
    Baseline("quack_library", "quack's own library epilogue where the expert kernel is ours (eval/quack_library.py)",
             "quack 0.6.5", "k2 k5 k6", "judge"),
    Baseline("coda", "CODA's own kernels (coda-kernels 0.2), in a worker of their own with their quack (eval/coda.py)",
             "coda-kernels 0.2 (quack 0.6.1)", "k3 k3hf k8 k9 k9l qkn", "judge"),
    Baseline("flashinfer", "cuBLAS + FlashInfer's norm / activation / rope kernels (eval/flashinfer.py)",
             "flashinfer-python 0.7.2.post1", "k0 k1 k2 k3 k3hf k4 k4hf k8 (no cross-entropy or backward kernels)",
             "judge"),
)}


def sol_configs(task, dims: dict, which: int = 0) -> list:
    """The fastest known identity-GEMM configs for the task's GEMM number `which` (its
    shape and operand layouts), from eval/data/sol-configs.json."""
    from epiforge.primitives.config import GemmConfig

    if not SOL_TABLE.is_file():
        return []
    m, n, k = task.gemm_shapes(dims)[which]
    g = task.gemm_list[which][1]
    key = f"{m}x{n}x{k}:{g.b_layout}" + (":km" if g.a_layout == "km" else "")
    known = json.loads(SOL_TABLE.read_text()).get("configs", {}).get(key, [])
    return [GemmConfig.parse(c) for c in known]


def gemm_candidates(task, dims: dict, operand_sets: list, kernel_configs: list, device: str,
                    built_s: dict | None = None) -> tuple[dict[str, Callable], dict[str, str]]:
    """The plain GEMMs that may be the speed of light, {name: fn(j)} for input set j, and
    {name: why} for those left out (a config or quack that does not run here: cuBLAS stays).
    operand_sets[j] is Task.gemm_operand_sets of input set j: one (A, B) per fused GEMM.
    A task of one GEMM: cuBLAS, and quack's identity GEMM at the kernel's configs and the
    shape's fastest known ones. A task of several: each candidate runs all its GEMMs, one
    after another: cuBLAS for each; quack's identity GEMM for each at that GEMM's fastest
    known config (else quack's default); and, mixed, each GEMM by whichever of the two ran it
    faster in a few calls timed here. built_s, if given, gets {name: seconds} of each one's
    first call (its build or load)."""
    import time

    import torch

    if task.gemm_count > 1:
        return _sequence_candidates(task, dims, operand_sets, device, built_s)
    fns = {"cublas": lambda j: torch.mm(operand_sets[j][0][0], operand_sets[j][0][1].T)}
    skipped = {}
    seen = set()
    for cfg in [*kernel_configs, *sol_configs(task, dims)]:
        cfg = cfg and cfg.for_plain_gemm()  # the kernel's tile, as a GEMM that loads no C
        if cfg is None or cfg.key() in seen:
            continue
        seen.add(cfg.key())
        fn = (lambda j, _c=cfg: identity_gemm(operand_sets[j][0][0], operand_sets[j][0][1], config=_c))
        name = f"quack_gemm@{cfg.key()}"
        t0 = time.perf_counter()
        try:
            fn(0)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # this config or quack does not run here: not a candidate
            skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            continue
        finally:
            if built_s is not None:
                built_s[name] = round(time.perf_counter() - t0, 3)
        fns[name] = fn
    return fns, skipped


#: the candidates of a task of several GEMMs beside "cublas": quack's identity GEMM for each
#: GEMM at its fastest known config, and each GEMM by the faster of the two
QUACK_SEQUENCE = "quack_gemm@fastest_known"
MIXED_SEQUENCE = "gemm_mixed"
#: calls per GEMM and library that pick the mixed sequence's library for each GEMM
MIXED_PICK_CALLS = 3


def _sequence_candidates(task, dims, operand_sets, device, built_s):
    import statistics
    import time

    import torch

    from epiforge.eval.timing import timed_call
    from epiforge.primitives.config import DEFAULT_CONFIG

    configs = [next(iter(sol_configs(task, dims, i)), DEFAULT_CONFIG).for_plain_gemm()
               for i in range(task.gemm_count)]
    one = {"cublas": lambda j, i: torch.mm(operand_sets[j][i][0], operand_sets[j][i][1].T),
           "quack": lambda j, i: identity_gemm(*operand_sets[j][i], config=configs[i])}
    fns = {"cublas": lambda j: [one["cublas"](j, i) for i in range(task.gemm_count)],
           QUACK_SEQUENCE: lambda j: [one["quack"](j, i) for i in range(task.gemm_count)]}
    skipped = {}
    t0 = time.perf_counter()
    try:
        fns[QUACK_SEQUENCE](0)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # quack does not run here: cuBLAS stays
        skipped[QUACK_SEQUENCE] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        skipped[MIXED_SEQUENCE] = "quack does not run here: the mixed sequence is cuBLAS's"
        del fns[QUACK_SEQUENCE]
        return fns, skipped
    finally:
        if built_s is not None:
            built_s[QUACK_SEQUENCE] = round(time.perf_counter() - t0, 3)
    clock = "cuda" if device == "cuda" else "wall"
    picks = []
    for i in range(task.gemm_count):
        times = {lib: statistics.median(timed_call(lambda f=f: f(0, i), clock=clock) for _ in range(MIXED_PICK_CALLS))
                 for lib, f in one.items()}
        picks.append(min(times, key=times.get))
    fns[MIXED_SEQUENCE] = lambda j: [one[lib](j, i) for i, lib in enumerate(picks)]
    return fns, skipped


#: the composite baselines: registry name -> (the eval module whose composites() has them, the library)
COMPOSITES = {"liger": ("epiforge.eval.liger", "Liger"), "flashinfer": ("epiforge.eval.flashinfer", "FlashInfer")}

#: the baselines that reports (compare's tables, the leaderboard) give a speedup column, in
#: this order, where a Result has them
REPORTED = ("coda", "torch_compile", "liger", "flashinfer", "quack_library", "eager", "cublas")

#: baselines timed in a worker process of their own, started per shape (eval/coda.py): nothing
#: built ahead in another process carries over to them
IN_WORKER = ("coda",)


def close_baselines(fns: dict) -> None:
    """End the workers of extra_baselines' fns (those timed in a process of their own)."""
    for fn in fns.values():
        close = getattr(fn, "close", None)
        if close is not None:
            close()


#: baselines the evaluator always times; the others are asked for by name
STANDARD = ("cublas", "quack_gemm", "gemm_only", "eager")


def unfused_fn(task):
    """task.unfused as a plain function (dynamo traces it without the pydantic object)."""
    reference = task._module.reference
    dtypes = {o.name: o.torch_dtype for o in task.outputs}

    def unfused(inputs, dims):
        out = reference(inputs, dims)
        return {k: out[k].to(dt) for k, dt in dtypes.items()}

    return unfused


def extra_baselines(names, task, dims: dict, input_sets: list, device: str,
                    built_s: dict | None = None) -> tuple[dict[str, Callable], dict, dict]:
    """The asked-for baselines beyond the standard ones: ({name: fn(j)}, {name: note},
    {name: why it was left out}). A baseline timed in a process of its own (coda) has
    timed_us(j) instead of a call the judge times, refresh(j) and close(). Each is called once here (a compile, a check that it runs);
    built_s, if given, gets {name: seconds} of building it and that first call."""
    import time

    import torch

    fns, notes, skipped = {}, {}, {}
    for name in names:
        if name in STANDARD:
            continue
        t0 = time.perf_counter()
        entry = REGISTRY.get(name)
        if entry is None:
            raise ValueError(f"unknown baseline {name!r}; known: {', '.join(REGISTRY)}")
        fn, note = None, entry.what
        if entry.where != "judge":
            skipped[name] = entry.where
            continue
        if name == "torch_compile":
            compiled = torch.compile(unfused_fn(task), dynamic=True)
            fn = (lambda j, _c=compiled: _c(input_sets[j], dims))
        elif name in COMPOSITES:  # cuBLAS + a kernel library's unfused ops, one composite per task
            module, library = COMPOSITES[name]
            found = importlib.import_module(module).composites().get(task.name)
            if found is None:
                skipped[name] = f"{library} is not installed here, or has no composite for this task"
                continue
            fn, note = (lambda j, _f=found[0]: _f(input_sets[j], dims)), found[1]
        elif name == "coda":  # timed in its own worker (timed_us), its outputs checked when it starts
            from epiforge.eval.coda import CodaBaseline, CodaUnavailable

            try:
                fn = CodaBaseline(task, dims, input_sets, device)
            except CodaUnavailable as e:
                skipped[name] = str(e)
                continue
            except Exception as e:  # it did not start here (out of memory, ...): left out, and the Result says why
                skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                continue
            finally:
                if built_s is not None:
                    built_s[name] = round(time.perf_counter() - t0, 3)
            fns[name], notes[name] = fn, fn.note
            continue
        elif name == "quack_library":
            from epiforge.eval.quack_library import alternatives

            found = alternatives().get(task.name)
            if found is None:
                from epiforge.eval.leaderboard import expert_author

                skipped[name] = ("the expert kernel is quack's library epilogue itself"
                                 if expert_author(task.name).startswith("quack library")
                                 else "quack's library has no epilogue for this task")
                continue
            a, w = task.gemm_operand_sets(input_sets[0], dims)[0]
            cfg = P.pick_config(found[2], a, w)
            fn, note = (lambda j, _f=found[0], _c=cfg: _f(input_sets[j], _c)), found[1]
        try:
            fn(0)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # it does not run here: left out, and the Result says why
            skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
            continue
        finally:
            if built_s is not None and fn is not None:
                built_s[name] = round(time.perf_counter() - t0, 3)
        fns[name], notes[name] = fn, note
    return fns, notes, skipped
