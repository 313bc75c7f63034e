"""Train the fused model (training/model.py) and its unfused float32 reference side by side
from the same initial weights on the same synthetic token stream, and record both loss
curves: python -m epiforge.training.loss_curve [--steps 200] [--device cpu|cuda] --out DIR.

The data: sequences from a fixed random Markov chain over the vocabulary (each token has
--successors likely next tokens, Dirichlet weights), so there is structure to learn and the
loss falls from about log V towards the chain's entropy rate (recorded). Every step's batch is
drawn once from a seeded generator and fed to both models.

The optimiser: AdamW for all, same settings, stepping float32 master weights. The fused
model holds bfloat16 parameters (what the kernels take): the masters are rounded into them
after each step. The reference is float32 throughout. A third run, the float32 reference
whose parameters are the bf16-rounded masters (float32 arithmetic, the fused model's
weights), splits the fused-vs-reference gap into what holding bf16 weights costs and what
the kernels' bf16 arithmetic costs (fused vs that run).

Writes DIR/loss_curve_<device>.json (the curves, their max and mean deviations, sizes,
settings, the environment with the command and commit) and DIR/loss_curve_<device>.png.
On a CPU the expert kernels run through the emulator (the JSON says so).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from epiforge.training.layer import LlamaLayerConfig
from epiforge.training.model import FusedLlamaModel, LlamaModelConfig, ReferenceLlamaModel

def markov_chain(vocab: int, successors: int, gen: torch.Generator) -> torch.Tensor:
    """A (V, V) row-stochastic transition matrix: each token's `successors` next tokens
    (distinct, random) with Dirichlet(1) weights, the others 0."""
    probs = torch.zeros(vocab, vocab, dtype=torch.float64)
    for token in range(vocab):
        nxt = torch.randperm(vocab, generator=gen)[:successors]
        weights = -torch.log(torch.rand(successors, generator=gen, dtype=torch.float64))  # Dirichlet(1)
        probs[token, nxt] = weights / weights.sum()
    return probs


def entropy_rate(probs: torch.Tensor) -> float:
    """The chain's entropy per token (nats) under its stationary distribution: the loss a
    model that knows the chain reaches."""
    pi = torch.full((probs.shape[0],), 1.0 / probs.shape[0], dtype=torch.float64)
    for _ in range(500):
        pi = pi @ probs
    plogp = torch.where(probs > 0, probs * probs.log(), torch.zeros_like(probs))
    return float(-(pi * plogp.sum(-1)).sum())


def sample_batches(probs: torch.Tensor, steps: int, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """(steps, batch, seq + 1) int64: each sequence starts at a uniform token and walks the chain."""
    vocab = probs.shape[0]
    out = torch.empty(steps * batch, seq + 1, dtype=torch.int64)
    out[:, 0] = torch.randint(0, vocab, (steps * batch,), generator=gen)
    for t in range(seq):
        out[:, t + 1] = torch.multinomial(probs[out[:, t]], 1, generator=gen).squeeze(1)
    return out.reshape(steps, batch, seq + 1)


def uncommitted_tracked_files() -> list[str] | None:
    """The tracked files that differ from the commit (what "-dirty" on the commit means: on a
    shared checkout they may be others' files, not training/'s), or None without git."""
    from epiforge.eval.machine import REPO

    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                             timeout=20, check=True, cwd=REPO).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted(line[3:] for line in out.splitlines() if line.strip())


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m epiforge.training.loss_curve", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--successors", type=int, default=4, help="likely next tokens per token in the Markov chain")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=768)
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON and PNG")
    return p.parse_args(argv)


def _train(model, batches, args, bf16_weights: bool):
    """AdamW over `batches` on float32 master copies of the parameters, copied into them
    after each step (rounded to bf16 first with bf16_weights). -> (losses, seconds)."""
    params = list(model.parameters())
    masters = [p.detach().float().clone() for p in params]
    opt = torch.optim.AdamW(masters, lr=args.lr, weight_decay=args.weight_decay)
    losses = []
    start = time.perf_counter()
    for step_batch in batches:
        tokens = step_batch.to(args.device)
        model.zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        for m, p in zip(masters, params):
            m.grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m.bfloat16() if bf16_weights else m)
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def deviation(a: list[float], b: list[float]) -> dict:
    """max and mean |a - b| over the steps, and the (1-based) step of the max."""
    gaps = [abs(x - y) for x, y in zip(a, b)]
    return {"max_abs": max(gaps), "mean_abs": sum(gaps) / len(gaps), "max_abs_step": 1 + gaps.index(max(gaps))}


def _plot(path: Path, fused: list[float], ref: list[float], ref_bf16w: list[float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1))
    steps = range(1, len(fused) + 1)
    top.plot(steps, ref, label="unfused float32 reference", lw=1.5)
    top.plot(steps, fused, label="fused (expert kernels, bf16)", lw=1.0, ls="--")
    top.set_ylabel("cross-entropy (nats)")
    top.set_title(title, fontsize=9)
    top.legend()
    bottom.plot(steps, [f - r for f, r in zip(fused, ref)], color="tab:red", lw=0.8, label="fused - reference")
    bottom.plot(steps, [f - r for f, r in zip(fused, ref_bf16w)], color="tab:green", lw=0.8,
                label="fused - reference with the bf16 weights")
    bottom.axhline(0, color="gray", lw=0.5)
    bottom.set_ylabel("loss difference")
    bottom.legend(fontsize=7)
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    from epiforge.eval.machine import command_line
    from epiforge.eval.machine import fingerprint

    args = parse_args(sys.argv[1:] if argv is None else argv)
    layer = LlamaLayerConfig(d=args.d, n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.head_dim,
                             ffn=args.ffn)
    cfg = LlamaModelConfig(vocab=args.vocab, n_layers=args.layers, layer=layer)
    gen = torch.Generator().manual_seed(args.seed)
    probs = markov_chain(args.vocab, args.successors, gen)
    batches = sample_batches(probs, args.steps, args.batch, args.seq, gen)

    torch.manual_seed(args.seed)
    init = {k: v.bfloat16().float() for k, v in ReferenceLlamaModel(cfg).to_hf_state_dict().items()}
    ref, ref_bf16w = ReferenceLlamaModel(cfg, device=args.device), ReferenceLlamaModel(cfg, device=args.device)
    fused = FusedLlamaModel(cfg, device=args.device)
    for model in (ref, ref_bf16w, fused):
        model.load_hf_state_dict({k: v.to(args.device) for k, v in init.items()})

    ref_losses, ref_seconds = _train(ref, batches, args, bf16_weights=False)
    ref_bf16w_losses, ref_bf16w_seconds = _train(ref_bf16w, batches, args, bf16_weights=True)
    fused_losses, fused_seconds = _train(fused, batches, args, bf16_weights=True)

    gap = deviation(fused_losses, ref_losses)
    n_params = sum(p.numel() for p in ref.parameters())
    device_note = ("the emulator's run on a CPU: the expert kernels' epilogues emulated in torch "
                   "(primitives/emulator.py), not the GPU kernels" if args.device == "cpu"
                   else "the expert kernels on the GPU")
    report = {
        "what": "loss curves of the fused model (training/model.py, expert kernels) and its unfused float32 "
                "reference, same initial weights (bf16 values), same batches, AdamW; and of the reference holding "
                "the fused model's bf16-rounded weights (float32 arithmetic)",
        "device": args.device,
        "note": device_note,
        "model": {"vocab": cfg.vocab, "n_layers": cfg.n_layers, "d": layer.d, "n_heads": layer.n_heads,
                  "n_kv_heads": layer.n_kv_heads, "head_dim": layer.head_dim, "ffn": layer.ffn, "eps": layer.eps,
                  "rope_theta": layer.rope_theta, "parameters": n_params},
        "data": {"kind": "Markov chain token stream", "successors_per_token": args.successors,
                 "entropy_rate_nats": entropy_rate(probs), "uniform_loss_nats": math.log(args.vocab),
                 "batch": args.batch, "seq": args.seq, "tokens_per_step": args.batch * args.seq},
        "training": {"steps": args.steps, "optimizer": "AdamW", "lr": args.lr, "weight_decay": args.weight_decay,
                     "seed": args.seed,
                     "masters": "AdamW steps float32 master weights in every run",
                     "fused": "bf16 parameters (the masters rounded) and activations",
                     "reference": "float32 parameters and activations",
                     "reference_bf16_weights": "float32 activations, the masters rounded to bf16 as parameters"},
        "curves": {"fused": fused_losses, "reference": ref_losses, "reference_bf16_weights": ref_bf16w_losses},
        "deviation": gap | {"final_fused": fused_losses[-1], "final_reference": ref_losses[-1]},
        "deviation_fused_vs_reference_bf16_weights": deviation(fused_losses, ref_bf16w_losses),
        "deviation_reference_bf16_weights_vs_reference": deviation(ref_bf16w_losses, ref_losses),
        "seconds": {"fused": fused_seconds, "reference": ref_seconds, "reference_bf16_weights": ref_bf16w_seconds},
        "environment": fingerprint(args.device, command_line("epiforge.training.loss_curve", argv)),
        "uncommitted_tracked_files": uncommitted_tracked_files(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"loss_curve_{args.device}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    title = (f"{cfg.n_layers} layers, d {layer.d}, V {cfg.vocab}, {args.steps} steps, lr {args.lr}, {args.device}"
             f"{' (emulator)' if args.device == 'cpu' else ''}; max |fused - ref| {gap['max_abs']:.4f}")
    _plot(stem.with_suffix(".png"), fused_losses, ref_losses, ref_bf16w_losses, title)
    kernels_only = report["deviation_fused_vs_reference_bf16_weights"]
    print(f"{stem}.json: final loss fused {fused_losses[-1]:.4f}, reference {ref_losses[-1]:.4f}; "
          f"deviation max {gap['max_abs']:.4f} mean {gap['mean_abs']:.4f} (against the reference with bf16 weights: "
          f"max {kernels_only['max_abs']:.4f} mean {kernels_only['mean_abs']:.4f}); "
          f"{fused_seconds:.0f} s fused, {ref_seconds:.0f} s reference")
    return report


if __name__ == "__main__":
    main()
