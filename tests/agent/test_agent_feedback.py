"""What the model hears about an evaluation: never the seed (the inputs and the hidden
shapes derive from it), never a hidden shape's dims, and a CPU-only pass is provisional."""

import re

from agent.feedback import describe
from eval import evaluate
from eval.secret_shapes import hidden_shapes

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
