"""README.md's Training example runs as written (on the CPU, through the emulator) and does
what its comments say."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_training_example_runs_and_trains():
    section = README.read_text().split("## Training", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, "README.md (Training)", "exec"), scope)
    model, tokens, logits, loss = scope["model"], scope["tokens"], scope["logits"], scope["loss"]
    assert logits.shape == (2, 32, 520) and logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert torch.isfinite(loss) and all(p.grad is None for p in model.parameters())  # zero_grad ran
    with torch.no_grad():  # the optimizer step lowered the loss on the same batch
        assert model(tokens[:, :-1], tokens[:, 1:]) < loss
