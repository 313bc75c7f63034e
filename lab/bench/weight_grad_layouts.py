"""The weight-gradient GEMMs of the 1B training step in each operand order cuBLAS can be
asked for, timed in one interleaved run (issue 15: in step-6.json the fused step's plain
cuBLAS weight gradients, `dW = G^T X`, took 6-20 % longer than the same shapes in
torch.compile's step).

    python -m lab.bench.weight_grad_layouts --out $OUT/weight-grad-layouts.json

For each (G: M x n, X: M x k) of the step (the gate/up, down, QKV, O and LM-head weights at
M = 16384 tokens), three ways to the same n x k weight gradient:
- `gt_x`: G.T @ X (the fused model's way, training/ops.py);
- `xt_g_t`: (X.T @ G).T, a transposed view of the k x n product (no copy);
- `xt_g_t_copy`: the same made contiguous (one more pass over the weight).
With --quack CONFIG [...] (indexes into bench.configs.CANDIDATES or config keys), quack's
plain GEMM (an identity epilogue) of the same G^T X joins them at each of those tiles
(`quack@<key>`), reading the same transposed views: whether the fixed mainloop runs these
weight gradients faster than cuBLAS. Build its objects here first: `python -m
lab.bench.precompile --parts gemm --configs <the same>` (the GEMM-only part compiles
every operand layout, the weight gradients' transposed A included).
Each repetition runs every variant once in a fresh random order (eval/timing.py); the
ratios are per repetition against gt_x, with bootstrap intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

#: (name, n, k) at d = 2048, F = 8192, GQA 32/8 of 64, V = 128256
SHAPES = [("gate_up", 16384, 2048), ("down", 2048, 8192), ("qkv", 3072, 2048), ("o", 2048, 2048),
          ("lm_head", 128256, 2048)]
TOKENS = 16384


def variants(g: torch.Tensor, x: torch.Tensor, quack_configs=()) -> dict:
    """{name: fn() -> G^T X}: cuBLAS in three operand orders, and quack's plain GEMM at each
    of quack_configs (GemmConfig), A = G^T and B = X^T as views (no copy)."""
    from epiforge.eval.baselines import identity_gemm

    ways = {"gt_x": lambda: g.T @ x, "xt_g_t": lambda: (x.T @ g).T, "xt_g_t_copy": lambda: (x.T @ g).T.contiguous()}
    for cfg in quack_configs:
        ways[f"quack@{cfg.key()}"] = lambda cfg=cfg: identity_gemm(g.T, x.T, config=cfg)["D"]
    return ways


def main(argv: list[str] | None = None) -> int:
    from lab.bench.gpu_env import fingerprint
    from epiforge.eval.stats import paired_ratio
    from epiforge.eval.timing import time_cuda_interleaved

    parser = argparse.ArgumentParser(prog="python -m lab.bench.weight_grad_layouts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quack", nargs="*", default=[], metavar="CONFIG",
                        help="time quack's plain GEMM too, at these configs (bench.configs.CANDIDATES indexes or keys)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from lab.bench.configs import config_args

    try:
        quack_configs = [c.for_plain_gemm() for c in config_args(args.quack)]
    except (ValueError, IndexError) as e:
        parser.error(f"--quack: {e}")
    if not torch.cuda.is_available():
        print("weight_grad_layouts: needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, n, k in SHAPES:
        g = torch.randn(TOKENS, n, device="cuda", generator=gen).bfloat16()
        x = torch.randn(TOKENS, k, device="cuda", generator=gen).bfloat16()
        ways = variants(g, x, quack_configs)
        want = ways["gt_x"]().float()
        agree = {w: float((f().float() - want).abs().max()) for w, f in ways.items()}
        timings = time_cuda_interleaved({w: (lambda _i, f=f: f(), [(i,) for i in range(2)]) for w, f in ways.items()},
                                        warmup=3, reps=args.reps)
        row = {"weight": name, "n": n, "k": k, "tokens": TOKENS, "max_abs_difference_to_gt_x": agree,
               "median_us": {w: t.median_us for w, t in timings.items()},
               "time_over_gt_x": {w: paired_ratio(timings[w], timings["gt_x"], ci=True).model_dump()
                                  for w in ways if w != "gt_x"}}
        rows.append(row)
        print(name, {w: round(t.median_us, 1) for w, t in timings.items()}, flush=True)
        del g, x
    report = {"environment": fingerprint("python -m lab.bench.weight_grad_layouts " + " ".join(argv or sys.argv[1:])),
              "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
