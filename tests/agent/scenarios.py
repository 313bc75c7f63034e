"""Scripted "models" for the loopback servers: what a model might answer, step by step,
reacting to the harness's feedback. No LLM is involved; logs they produce say so in their
model name ("scripted-loopback-server").
"""

from __future__ import annotations

from loopback import Reply, last_tool_results

# ---- k8: gate/up GEMM + SwiGLU (the shipped example session) -------------------------------

_K8_HEAD = '''"""k8: SwiGLU on the interleaved (gate, up) column pairs, in acc_pair mode: D keeps the raw
accumulator (the pre-activation z); "out" is the half-width SwiGLU."""

import primitives as P

TASK = "k8_gemm_swiglu"
'''
_K8_RUN = '''

def run(inputs, prepared, config=None):
    out = gate_up_swiglu(inputs["a"], inputs["w_gu"], config=config)
    return {"z": out["D"], "out": out["out"]}
'''
# 1st try: torch math inside the epilogue. The CPU emulator accepts it; the sm_90a build does not.
K8_TORCH_MATH = _K8_HEAD.replace("import primitives as P", "import torch\n\nimport primitives as P") + '''

@P.epilogue(outputs=("out",), mode="acc_pair")
def gate_up_swiglu(acc):
    gate, up = P.unpack(acc)
    return {"out": gate * torch.sigmoid(gate) * up}
''' + _K8_RUN
# 2nd try: primitives math, but the lanes swapped (the odd column taken for the gate).
K8_SWAPPED = _K8_HEAD + '''

@P.epilogue(outputs=("out",), mode="acc_pair")
def gate_up_swiglu(acc):
    up, gate = P.unpack(acc)
    return {"out": P.silu(gate) * up}
''' + _K8_RUN
K8_GOOD = _K8_HEAD + '''

@P.epilogue(outputs=("out",), mode="acc_pair")
def gate_up_swiglu(acc):
    gate, up = P.unpack(acc)  # even column: gate unit j, odd column: up unit j
    return {"out": P.swiglu(gate, up)}
''' + _K8_RUN


def _after(expected: str, reply: Reply):
    """Answer `reply` if the feedback mentions `expected`; otherwise stop (the test fails)."""
    def step(body):
        if expected not in last_tool_results(body):
            return Reply(text=f"scripted model: expected {expected!r} in the feedback; stopping")
        return reply
    return step


def k8_example() -> list:
    return [
        Reply("I will start from the expert kernels of related tasks.", [("list_examples", {})]),
        Reply("k2 fuses SwiGLU on interleaved (gate, up) pairs in acc_pair mode; k8 is the same without rstd.",
              [("read_example", {"task": "k2"})]),
        _after("acc_pair", Reply("First version: store the accumulator as z and SwiGLU as out.",
                                 [("write_kernel", {"source": K8_TORCH_MATH}), ("run_check", {})])),
        _after("COMPILE_ERROR", Reply("The epilogue is traced for sm_90a, so torch calls cannot run inside it; "
                                      "use the primitives' silu.",
                                      [("write_kernel", {"source": K8_SWAPPED}), ("run_check", {})])),
        _after("INCORRECT_NUMERICS", Reply("z matches but out does not: I swapped the lanes. Even columns hold the "
                                           "gate (row 2j of w_gu), odd columns the up unit.",
                                           [("write_kernel", {"source": K8_GOOD}), ("run_check", {})])),
        _after("PASSED", Reply("The check passes on the emulator and the sm_90a build. Submitting.", [("submit", {})])),
    ]


# ---- k1: deferred RMSNorm row scale (fast tests: no compile) --------------------------------

K1_GOOD = '''import primitives as P

TASK = "k1_gemm_rmsnorm"


@P.epilogue(operands={"rstd": P.PerRow()})
def scale_rows(acc, rstd):
    return {"D": acc * rstd}


def run(inputs, prepared, config=None):
    return {"out": scale_rows(inputs["h"], inputs["w"], rstd=inputs["rstd"], config=config)["D"]}
'''
# a systematic 2% scale error: inside the max-error rule's slack at some elements, caught overall
K1_OFF_BY_2PCT = K1_GOOD.replace("acc * rstd}", "acc * rstd * 1.02}")
K1_SYNTAX_ERROR = K1_GOOD.replace("def run(", "def run(:")
# a kernel whose run() never returns: only a timeout ends its check
K1_HANGS = K1_GOOD.replace("def run(inputs, prepared, config=None):\n",
                           "def run(inputs, prepared, config=None):\n    n = 0\n    while n >= 0:\n        n += 1\n")
