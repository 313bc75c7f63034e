"""k4hf: k4's reference; the direction comes from the task's scalar rope_direction."""

from epiforge.tasks.k4_gemm_rmsnorm_rope.reference import make_inputs, reference  # noqa: F401
