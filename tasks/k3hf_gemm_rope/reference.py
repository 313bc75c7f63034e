"""k3hf: k3's reference; the direction comes from the task's scalar rope_direction."""

from epiforge.tasks.k3_gemm_rope.reference import make_inputs, reference  # noqa: F401
