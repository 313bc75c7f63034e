"""What the model hears about an evaluation: never the seed (the inputs and the hidden
shapes derive from it), never a hidden shape's dims, and a CPU-only pass is provisional."""

import re

from epiforge.agent.feedback import describe
from epiforge.eval import evaluate
from epiforge.eval.secret_shapes import hidden_shapes

import pytest

pytestmark = pytest.mark.spawns  # its tests start processes (conftest.py)

SEED = 918273645
PUBLIC_ONLY = '''"""Right on the public smoke shapes only."""
import primitives as P
import torch

TASK = "k1_gemm_rmsnorm"


@P.epilogue(operands={"rstd": P.PerRow()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    h, w = inputs["h"], inputs["w"]
    if h.shape[0] in (320, 256):
        return {"out": row_scale(h, w, rstd=inputs["rstd"], config=config)["D"]}
    return {"out": torch.zeros(h.shape[0], w.shape[0], dtype=torch.bfloat16)}
'''


def test_a_hidden_shape_fails_without_naming_its_dims_or_the_seed(tmp_path):
    kernel = tmp_path / "public_only.py"
    kernel.write_text(PUBLIC_ONLY)
    r = evaluate("k1", str(kernel), seed=SEED)
    assert r.outcome.value == "INCORRECT_NUMERICS", r.message
    failed = r.per_shape[-1]
    assert failed.hidden and failed.dims == {} and failed.shape == "hidden"
    assert [s.outcome.value for s in r.per_shape if not s.hidden] == ["PASSED", "PASSED"]
    assert "hidden shape" in r.message and r.worst["index"] is None
    text = describe(r, what="check")
    numbers = set(re.findall(r"\d+", text))
    assert str(SEED) not in numbers, text
    for shape in hidden_shapes("smoke", SEED):
        assert not {str(shape.M), str(shape.F), str(shape.V), str(3 * shape.d)} & numbers, text


def test_a_cpu_pass_is_provisional_in_what_the_model_hears():
    r = evaluate("k1", "human", seed=SEED)
    assert r.passed and r.provisional and not r.ranked
    text = describe(r, what="submit")
    assert "provisional" in text and str(SEED) not in text and "hidden" in text
    # judged in both precisions: every shape's line says which (an agent asked for it)
    shape_lines = [line for line in text.splitlines() if line.startswith("  ") and ": ok (" in line]
    assert shape_lines and all(re.match(r"  \S+ \((bfloat16|float16)\) ", line) for line in shape_lines), text
    assert {"(bfloat16)", "(float16)"} <= {line.split()[1] for line in shape_lines}


def test_the_worst_mismatch_is_said_once(tmp_path):
    from scenarios import K1_OFF_BY_2PCT

    kernel = tmp_path / "off.py"
    kernel.write_text(K1_OFF_BY_2PCT)
    r = evaluate("k1", str(kernel), seed=SEED)
    assert r.outcome.value == "INCORRECT_NUMERICS"
    failed = [c for s in r.per_shape for c in s.outputs if not c.ok]
    text = describe(r, what="check")
    assert failed and all(text.count(c.detail) <= 1 for c in failed), text
    assert "max error" in text and "FAILED tolerance" in text  # still said, where it failed


def test_a_dsl_compile_error_reaches_the_model_as_plain_text_without_dsl_only_hints():
    """The CuTe DSL colours its diagnostics and suggests @jit, which an epilogue author cannot
    use (the harness traces the function); lowering joins the compiler's last lines with ' | '."""
    from cutlass.base_dsl.diagnostics import _format_labeled_text

    from epiforge.eval.result import Outcome, Result

    lines = ["DSLRuntimeError: Cannot use a Runtime value as a list index or for loop range in plain Python code",
             *_format_labeled_text("suggestion", "Mark the loop as dynamic with @dynamic_expr or @range_dynamic"),
             *_format_labeled_text("suggestion", "Decorate the parent function with @jit so the indexing happens in "
                                                 "staged code where Runtime values are allowed"),
             *_format_labeled_text("suggestion", "Use P.exp on the value itself")]
    assert any("\x1b[" in line for line in lines)  # the DSL's own output is coloured
    error = "DSLRuntimeError: " + " | ".join(lines)
    message = f"smoke-a: CompileError: epilogue scale_rows [128x192_c2x1_pp] does not compile for sm_90a: {error}"
    base = dict(task="k1_gemm_rmsnorm", kernel="kernel.py", kernel_sha256="0" * 64, track="candidate", device="cpu",
                shapes="smoke")
    r = Result.judged(base, Outcome.COMPILE_ERROR, "numerics", message, [], compiled=[{"epilogue": "scale_rows", "config": "128x192_c2x1_pp", "ok": False, "error": error,
                          "seconds": 4.2}])
    text = describe(r, what="check")
    assert "\x1b" not in text and "@jit" not in text and "dynamic_expr" not in text
    assert "Cannot use a Runtime value as a list index" in text and "Use P.exp on the value itself" in text
    assert text.count("list index") == 1  # the compile log points at the error instead of repeating it
    assert "scale_rows [128x192_c2x1_pp]" in text and "FAILED (the error above)" in text
