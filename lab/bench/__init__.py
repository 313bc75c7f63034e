"""GPU benchmarks of the expert track against its baselines (lab/README.md)."""
