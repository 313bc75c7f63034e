"""lab/bench/'s result files as models: a BenchRow per task and paper scale (lab/bench/run.py), a
ChainRow per scale (lab/bench/chain.py), a CheckRow per task and shape (lab/bench/check_gpu.py), and
a LauncherRow per task and shape (lab/bench/launcher_overhead.py), and the report holding them with
its environment.
Each row is made by one factory, `measured`, from the Timings of one interleaved run, every
ratio taken repetition by repetition (eval.stats.paired_ratio) and the speed of light picked
by the evaluator's own rule (eval.stats.fastest). load_report reads a file, the committed ones
of earlier layouts included (each row's before-validator migrates them). Torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from epiforge.eval.result import RatioStat, Result
from epiforge.eval.stats import Timing, fastest, paired_ratio, speed, summarize
from epiforge.tasks.tolerance import OutputCheck

#: the plain GEMMs of a bench row that may be its speed of light (GEMM-only)
PLAIN_GEMMS = ("gemm_cublas", "gemm_quack", "gemm_quack_best")
_Ratio = Field(None, gt=0)


def _is_timing(value) -> bool:
    return isinstance(value, dict) and "median_us" in value


def _errors_apart(data: dict) -> dict:
    """An earlier layout kept "<what>_error" beside the timings: under errors[what] now."""
    errors = dict(data.get("errors", {}))
    rest = {}
    for key, value in data.items():
        if key.endswith("_error") and isinstance(value, str):
            errors[key[: -len("_error")]] = value
        else:
            rest[key] = value
    return {**rest, "errors": errors} if errors else rest


class ConfigTimings(BaseModel):
    """What ran at one tile config in a bench row's run."""

    model_config = ConfigDict(extra="forbid")

    fused: Timing | None = Field(None, description="the expert kernel's run() at this config")
    gemm_quack: Timing | None = Field(None, description="quack's identity-epilogue GEMM at this config, as a "
                                                        "plain GEMM runs it (no early C loads)")
    quack_library: Timing | None = Field(None, description="quack's library epilogue, where it ran beside this config")
    quack_library_config: str | None = Field(None, description="the config the library ran at (its own, with "
                                                               "--tuned or a confirmation run)")
    diagnostics: dict[str, Timing] = Field({}, description="the kernel minus one piece of its work, by name "
                                                           "(eval/quack_library.py DIAGNOSTICS)")
    errors: dict[str, str] = Field({}, description="what did not run at this config: its exception's first line")

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data):
        """An earlier layout: "diag_<name>" and "<what>_error" keys beside the timings."""
        if not isinstance(data, dict):
            return data
        data = _errors_apart(data)
        diags = {k[len("diag_"):]: v for k, v in data.items() if k.startswith("diag_")}
        if not diags:
            return data
        rest = {k: v for k, v in data.items() if not k.startswith("diag_")}
        return {**rest, "diagnostics": {**rest.get("diagnostics", {}), **diags}}

    def get(self, what: str) -> Timing | None:
        """The timing of `what` ("fused", "gemm_quack", "quack_library", or "diag:NAME", a
        diagnostic) at this config."""
        if what.startswith("diag:"):
            return self.diagnostics.get(what[len("diag:"):])
        return getattr(self, what)


class Diagnostic(Timing):
    """A diagnostic at the row's best config, against the row's speed of light."""

    note: str = Field(description="what the kernel leaves out")
    config: str = Field(description="the config it ran at: the row's best_config")
    over_gemm_only: float = Field(gt=0, description="its time / GEMM-only, per repetition")


class BenchRow(BaseModel):
    """One task at one paper scale, everything timed in ONE interleaved run (lab/bench/run.py):
    the fused kernel at every config it ran at, quack's identity GEMM at those configs and at
    the sweep's best ones, and the baselines; then the best config and every ratio, taken
    repetition by repetition. Made by BenchRow.measured; the fields from best_config on are
    what it derives (rederived() derives them again from the samples)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    shape: str = Field(description="the paper scale: 1B, 7B, 70B")
    dims: dict[str, int]
    gemm_mnk: tuple[int, int, int]
    flops: float = Field(gt=0)
    min_bytes: float = Field(gt=0, description="the bytes the task must move at least")
    configs: dict[str, ConfigTimings] = Field(description="by config key (primitives.config.GemmConfig.key)")
    gemm_cublas: Timing = Field(description="torch.matmul of the same GEMM shape and operand layouts: the "
                                            "reference every config is ranked against, repetition by repetition")
    liger: Timing | None = Field(None, description="cuBLAS + Liger-Kernel's composite (eval/liger.py)")
    liger_note: str | None = None
    torch_compile: Timing | None = Field(None, description="cuBLAS + torch.compile of the unfused reference")
    gemm_quack_candidates: dict[str, Timing] = Field({}, description="quack's identity GEMM at a sweep's fastest "
                                                                     "configs (--sol-from, --configs-from)")
    quack_library_note: str | None = None
    errors: dict[str, str] = Field({}, description="a baseline that did not run: its exception's first line")

    # derived by measured()
    best_config: str | None = Field(None, description="where the fused kernel ran fastest; None: no config ran")
    fused: Timing | None = Field(None, description="the fused kernel at best_config")
    gemm_quack: Timing | None = Field(None, description="quack's identity GEMM at best_config")
    gemm_quack_best_config: str | None = None
    gemm_quack_best: Timing | None = Field(None, description="quack's identity GEMM at its own fastest config")
    quack_library: Timing | None = Field(None, description="the library epilogue at its fastest config")
    quack_library_config: str | None = None
    diagnostics: dict[str, Diagnostic] = {}
    gemm_only_us: float | None = Field(None, gt=0, description="the speed of light's median time")
    gemm_only_is: str | None = Field(None, description=f"which plain GEMM is the speed of light: one of {PLAIN_GEMMS}")
    fused_over_gemm_only: float | None = _Ratio
    fused_over_gemm_only_iqr: tuple[float, float] | None = Field(None, description="the per-repetition ratios' quartiles")
    fused_over_gemm_only_of_medians: float | None = Field(None, gt=0, description="the same as a ratio of medians")
    quack_over_cublas: float | None = _Ratio
    speedup_vs_quack_library: float | None = _Ratio
    quack_library_like_for_like: str | None = Field(None, description="the diagnostic that does what the library does, "
                                                                      "where the library does less than the task")
    speedup_vs_quack_library_like_for_like: float | None = _Ratio
    speedup_vs_liger: float | None = _Ratio
    liger_over_gemm_only: float | None = _Ratio
    speedup_vs_compile: float | None = _Ratio
    compile_over_gemm_only: float | None = Field(None, gt=0, description="the bound a perfect fusion reaches")
    fraction_of_bound: float | None = Field(None, gt=0, description="gemm_only / fused: the share of the bound reached")

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data):
        return _errors_apart(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _consistent(self) -> "BenchRow":
        def need(ok: bool, what: str):
            if not ok:
                raise ValueError(f"{self.task} {self.shape}: {what}")

        need((self.best_config is None) == (self.fused is None) == (self.fused_over_gemm_only is None),
             "best_config, fused and fused_over_gemm_only come together")
        if self.best_config is not None:
            at = self.configs.get(self.best_config)
            need(at is not None and at.fused == self.fused, "fused is the fused timing at best_config")
            need(self.gemm_quack is None or at.gemm_quack == self.gemm_quack, "gemm_quack is the one at best_config")
        need((self.gemm_quack_best is None) == (self.gemm_quack_best_config is None),
             "gemm_quack_best and its config come together")
        if self.gemm_quack_candidates and self.gemm_quack_best_config:
            need(self.gemm_quack_candidates.get(self.gemm_quack_best_config) == self.gemm_quack_best,
                 "gemm_quack_best is the candidate it names")
        if self.gemm_only_is is not None:
            sol = getattr(self, self.gemm_only_is, None) if self.gemm_only_is in PLAIN_GEMMS else None
            need(sol is not None and sol.median_us == self.gemm_only_us, "gemm_only_is names a plain GEMM timed here, "
                                                                         "gemm_only_us its median")
        for ratio, timing in (("speedup_vs_compile", "torch_compile"), ("speedup_vs_liger", "liger"),
                              ("speedup_vs_quack_library", "quack_library")):
            need(getattr(self, ratio) is None or getattr(self, timing) is not None, f"{ratio} without {timing}")
        need((self.quack_library_like_for_like is None) == (self.speedup_vs_quack_library_like_for_like is None)
             and (self.quack_library_like_for_like is None or self.quack_library_like_for_like in self.diagnostics),
             "a like-for-like library comparison names a diagnostic of the row")
        return self

    @classmethod
    def measured(cls, *, task: str, shape: str, dims: dict[str, int], gemm_mnk, flops: float, min_bytes: float,
                 configs: dict[str, ConfigTimings], gemm_cublas: Timing, liger: Timing | None = None,
                 liger_note: str | None = None, torch_compile: Timing | None = None,
                 gemm_quack_candidates: dict[str, Timing] | None = None, quack_library_note: str | None = None,
                 errors: dict[str, str] | None = None, diagnostic_notes: dict[str, str] | None = None,
                 like_for_like: str | None = None) -> "BenchRow":
        """The one factory: a row from what one interleaved run timed. The best config is the
        fused kernel's fastest (speed against cuBLAS, per repetition); quack's own best GEMM
        is the fastest candidate, or in a sweep of several configs the fastest at them; the
        speed of light is the fastest plain GEMM (eval.stats.fastest). diagnostic_notes: what
        each diagnostic leaves out; like_for_like: the diagnostic that does what quack's
        library does, where the library does less than the task."""
        candidates = gemm_quack_candidates or {}
        timed = dict(task=task, shape=shape, dims=dims, gemm_mnk=tuple(gemm_mnk), flops=flops, min_bytes=min_bytes,
                     configs=configs, gemm_cublas=gemm_cublas, liger=liger, liger_note=liger_note,
                     torch_compile=torch_compile, gemm_quack_candidates=candidates,
                     quack_library_note=quack_library_note, errors=errors or {})

        def fastest_at(what: str) -> str | None:
            at = {k: c.get(what) for k, c in configs.items() if c.get(what) is not None}
            return min(at, key=lambda k: speed(at[k], gemm_cublas)) if at else None

        picked: dict = {}
        if candidates:
            picked["gemm_quack_best_config"] = min(candidates, key=lambda k: speed(candidates[k], gemm_cublas))
            picked["gemm_quack_best"] = candidates[picked["gemm_quack_best_config"]]
        elif len(configs) > 1 and (k := fastest_at("gemm_quack")) is not None:
            picked["gemm_quack_best_config"], picked["gemm_quack_best"] = k, configs[k].gemm_quack
        if (lib := fastest_at("quack_library")) is not None:
            picked["quack_library"] = configs[lib].quack_library
            picked["quack_library_config"] = configs[lib].quack_library_config or lib
        if (best := fastest_at("fused")) is not None:
            picked.update(best_config=best, fused=configs[best].fused, gemm_quack=configs[best].gemm_quack)
        return cls(**timed, **picked, **_ratios(timed, picked, diagnostic_notes or {}, like_for_like))

    def rederived(self, like_for_like: str | None = None) -> "BenchRow":
        """The same row with its ratios taken again from its samples, at the configs the run
        picked (a definition added after the run). ValueError if a timing holds no samples:
        ratios from medians and from samples are not mixed in one row."""
        bare = next((where for where, t in self.timings() if not t.samples_us), None)
        if bare is not None:
            raise ValueError(f"{self.task} {self.shape}: {bare} holds no samples (a file from before they were kept), "
                             "so its ratios cannot be recomputed")
        timed = {k: getattr(self, k) for k in _TIMED}
        picked = {k: getattr(self, k) for k in _PICKED}
        notes = {n: d.note for n, d in self.diagnostics.items()}
        return BenchRow(**timed, **picked, **_ratios(timed, picked, notes, like_for_like))

    def timings(self) -> Iterator[tuple[str, Timing]]:
        """(where, timing) for every timing the row's run took (not the derived copies)."""
        for key in ("gemm_cublas", "liger", "torch_compile"):
            if getattr(self, key) is not None:
                yield key, getattr(self, key)
        for cfg, t in self.gemm_quack_candidates.items():
            yield f"gemm_quack_candidates.{cfg}", t
        for cfg, c in self.configs.items():
            for what in ("fused", "gemm_quack", "quack_library"):
                if c.get(what) is not None:
                    yield f"configs.{cfg}.{what}", c.get(what)
            for name, t in c.diagnostics.items():
                yield f"configs.{cfg}.diagnostics.{name}", t

    def fastest_configs(self, what: str, n: int) -> list[str]:
        """The n configs where `what` ran fastest (speed against cuBLAS), fastest first."""
        timed = {k: speed(c.get(what), self.gemm_cublas) for k, c in self.configs.items() if c.get(what) is not None}
        return sorted(timed, key=timed.get)[:n]


#: a BenchRow's fields that its run timed, and those measured() picks from them (the rest are ratios)
_TIMED = ("task", "shape", "dims", "gemm_mnk", "flops", "min_bytes", "configs", "gemm_cublas", "liger", "liger_note",
          "torch_compile", "gemm_quack_candidates", "quack_library_note", "errors")
_PICKED = ("gemm_quack_best_config", "gemm_quack_best", "quack_library", "quack_library_config", "best_config",
           "fused", "gemm_quack")


def _ratios(timed: dict, picked: dict, notes: dict[str, str], like_for_like: str | None) -> dict:
    """A bench row's ratios (and its diagnostics at the best config), each taken repetition
    by repetition (the power cap's drift cancels)."""
    fused = picked.get("fused")
    if fused is None:
        return {}
    cublas, quack, library = timed["gemm_cublas"], picked.get("gemm_quack"), picked.get("quack_library")
    liger, compiled = timed["liger"], timed["torch_compile"]
    # the speed of light: the fastest GEMM without an epilogue, over cuBLAS and quack at the
    # fused kernel's config and (from a sweep) at quack's own best config
    plain = {"gemm_cublas": cublas, "gemm_quack": quack, "gemm_quack_best": picked.get("gemm_quack_best")}
    sol = fastest({k: t for k, t in plain.items() if t is not None}, cublas)
    gemm_only = plain[sol]
    over = paired_ratio(fused, gemm_only)
    out = {"gemm_only_us": gemm_only.median_us, "gemm_only_is": sol, "fused_over_gemm_only": over.median,
           "fused_over_gemm_only_iqr": (over.q1, over.q3),
           "fused_over_gemm_only_of_medians": fused.median_us / gemm_only.median_us}
    best = picked["best_config"]
    diagnostics = timed["configs"][best].diagnostics
    out["diagnostics"] = {name: Diagnostic(**t.model_dump(), note=notes[name], config=best,
                                           over_gemm_only=paired_ratio(t, gemm_only).median)
                          for name, t in diagnostics.items() if name in notes}
    if quack is not None:
        out["quack_over_cublas"] = paired_ratio(quack, cublas).median
    if library is not None:
        out["speedup_vs_quack_library"] = paired_ratio(library, fused).median
        if like_for_like in out["diagnostics"]:  # the library does less than the task: also against the kernel minus that work
            out["quack_library_like_for_like"] = like_for_like
            out["speedup_vs_quack_library_like_for_like"] = paired_ratio(library, diagnostics[like_for_like]).median
    if liger is not None:
        out["speedup_vs_liger"] = paired_ratio(liger, fused).median
        out["liger_over_gemm_only"] = paired_ratio(liger, gemm_only).median
    if compiled is not None:
        out["speedup_vs_compile"] = paired_ratio(compiled, fused).median
        out["compile_over_gemm_only"] = paired_ratio(compiled, gemm_only).median
        # (tc / fused) / (tc / gemm_only) = gemm_only / fused: the share of the bound reached
        out["fraction_of_bound"] = paired_ratio(gemm_only, fused).median
    return out


class ChainRow(BaseModel):
    """The backward chain of one layer boundary at one paper scale (lab/bench/chain.py), everything
    timed in one interleaved run; made by ChainRow.measured."""

    model_config = ConfigDict(extra="forbid")

    shape: str
    dims: dict[str, int]
    configs: dict[str, str] = Field(description="the config each kernel ran at: k7, k6")
    timings: dict[str, Timing] = Field(description="fused, torch_compile, and each dgrad GEMM's candidates "
                                                   "(k7_gemm@cublas, k6_gemm@<config>, ...)")
    max_rel_diff_fused_vs_compiled: dict[str, float] = Field(description="per output: max |fused - compiled| / "
                                                                         "max |compiled|")
    gemm_only_us: float = Field(gt=0, description="the two dgrad GEMMs' fastest candidates, added per repetition")
    speedup_vs_compile: float = Field(gt=0)
    bound: float = Field(gt=0, description="torch.compile / GEMM-only")
    fused_over_gemm_only: float = Field(gt=0)
    fused_over_gemm_only_iqr: tuple[float, float]
    fraction_of_bound: float = Field(gt=0)
    variants_over_fused: dict[str, float] = Field(
        default_factory=dict,
        description="each other fused chain timed in the same run (timings 'fused@k7=<config>': k7 at another "
                    "config, e.g. a flag's twin) over `fused`, median of per-repetition ratios")

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data):
        """An earlier layout: the timings beside the row's other fields."""
        if not isinstance(data, dict) or "timings" in data:
            return data
        return {**{k: v for k, v in data.items() if not _is_timing(v)},
                "timings": {k: v for k, v in data.items() if _is_timing(v)}}

    @classmethod
    def measured(cls, *, shape: str, dims: dict[str, int], configs: dict[str, str], timings: dict[str, Timing],
                 max_rel_diff_fused_vs_compiled: dict[str, float]) -> "ChainRow":
        """The one factory. GEMM-only is the faster of each dgrad GEMM's candidates ("k7_gemm@..."
        and "k6_gemm@..."), ranked against cuBLAS's k7 GEMM repetition by repetition, their two
        times added repetition by repetition; every ratio is taken repetition by repetition too."""
        ref = timings["k7_gemm@cublas"]
        picked = [timings[fastest({k: t for k, t in timings.items() if k.startswith(f"{which}_gemm@")}, ref)]
                  for which in ("k7", "k6")]
        g = summarize([a + b for a, b in zip(picked[0].samples_us, picked[1].samples_us)], keep=True)
        f, tc = timings["fused"], timings["torch_compile"]
        over = paired_ratio(f, g)
        return cls(shape=shape, dims=dims, configs=configs, timings=timings,
                   max_rel_diff_fused_vs_compiled=max_rel_diff_fused_vs_compiled, gemm_only_us=g.median_us,
                   speedup_vs_compile=paired_ratio(tc, f).median, bound=paired_ratio(tc, g).median,
                   fused_over_gemm_only=over.median, fused_over_gemm_only_iqr=(over.q1, over.q3),
                   fraction_of_bound=paired_ratio(g, f).median,
                   variants_over_fused={k.removeprefix("fused@"): paired_ratio(t, f).median
                                        for k, t in timings.items() if k.startswith("fused@")})


class BenchReport(BaseModel):
    """A lab/bench/run.py result file."""

    environment: dict = Field(description="the machine, versions, date, command and commit (eval.machine.fingerprint)")
    reps: int | None = Field(None, ge=1, description="timed repetitions of each function")
    rederived: dict | None = Field(None, description="when the rows were derived again (bench.report --rederive)")
    rows: list[BenchRow]


class ChainReport(BaseModel):
    """A lab/bench/chain.py result file."""

    environment: dict
    rows: list[ChainRow]


class CheckRow(BaseModel):
    """One shape of one expert kernel's GPU check (lab/bench/check_gpu.py): the evaluator's
    verdict with timing off, its output checks and the kernels one run() launched."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    task: str
    shapes: str = Field(description="the shape set the evaluation ran (smoke | paper | ...)")
    shape: str = Field(description="the shape's name in that set (a hidden one's is withheld)")
    hidden: bool = Field(description="a shape drawn from the secret seed")
    outcome: str = Field(description="the shape's Outcome (PASSED, INCORRECT_NUMERICS, EXTRA_LAUNCHES, ...)")
    message: str
    outputs: list[OutputCheck]
    launch_names: list[str] = Field(description="the kernels one run() launched (torch profiler); none for a hidden shape")
    launches_ok: bool = Field(description="passed, and its launches were seen (or the shape is hidden)")

    @classmethod
    def of(cls, task: str, shapes: str, res) -> "CheckRow":
        """The row of one eval.result.ShapeResult."""
        passed = res.outcome.value == "PASSED"
        return cls(task=task, shapes=shapes, shape=res.shape, hidden=res.hidden, outcome=res.outcome.value,
                   message=res.message, outputs=res.outputs, launch_names=res.launches,
                   launches_ok=passed and (res.hidden or bool(res.launches)))


class CheckReport(BaseModel):
    """A lab/bench/check_gpu.py result file."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    environment: dict
    all_passed: bool = Field(description="every evaluation passed")
    rows: list[CheckRow]

    @classmethod
    def load(cls, path) -> "CheckReport":
        """A check file; ValueError, one line, if it is not one."""
        try:
            return cls.model_validate_json(Path(path).read_text())
        except OSError as e:
            raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
        except ValidationError as e:
            first = e.errors()[0]
            raise ValueError(f"{path}: not a bench.check_gpu result ({'.'.join(map(str, first['loc']))}: "
                             f"{first['msg']})") from None


class LauncherRow(BaseModel):
    """One task and shape of lab/bench/launcher_overhead.py: the same kernel judged in ONE
    interleaved run as its own process runs it ("one-process") and from its description, by
    a process without kernel code (the judge's launcher mode)."""

    model_config = ConfigDict(extra="forbid")

    task: str
    shape: str
    launcher_over_one_process: RatioStat = Field(description="launcher_i / one-process_i: 1.0, the description "
                                                             "costs nothing per call")
    fused_over_gemm_only: dict[str, float] = Field(description="each mode's fused / GEMM-only (median), by mode")

    @classmethod
    def of(cls, comparison, shape: str, one_process: str, launcher: str) -> "LauncherRow | None":
        """The row of an eval.compare.Comparison at `shape` of the two labels; None where
        either was not timed there."""
        ratio = comparison.versus(launcher, one_process, shape)
        if ratio is None:
            return None
        modes = {}
        for mode, label in (("one-process", one_process), ("launcher", launcher)):
            res = next(s for s in comparison.by_label(label).per_shape if s.shape == shape and s.timing)
            modes[mode] = res.timing.fused_over_gemm_only.median
        return cls(task=comparison.task, shape=shape, launcher_over_one_process=ratio, fused_over_gemm_only=modes)


class LauncherReport(BaseModel):
    """A lab/bench/launcher_overhead.py result file: the rows and every Result they came from."""

    environment: dict
    reps: int = Field(ge=1)
    rows: list[LauncherRow]
    results: list[Result] = Field(description="each kernel's Result in each mode, as the judge gave it")


def load_report(path, kind: type[BenchReport] | type[ChainReport] | None = None) -> BenchReport | ChainReport:
    """A result file of bench.run (BenchReport) or bench.chain (ChainReport), by its rows, or of
    `kind`; ValueError, one line, if it is not one."""
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("rows"), list):
        raise ValueError(f"{path}: not a result file (no list of rows)")
    is_chain = bool(raw["rows"]) and isinstance(raw["rows"][0], dict) and "task" not in raw["rows"][0]
    found = ChainReport if is_chain else BenchReport
    name = {BenchReport: "bench.run", ChainReport: "bench.chain"}
    if kind is not None and kind is not found:
        raise ValueError(f"{path}: not a {name[kind]} result (its rows are {name[found]}'s)")
    try:
        return found.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValueError(f"{path}: not a {name[found]} result ({where}: {first['msg']})") from None
