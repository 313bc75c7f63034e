"""GPU benchmarks of the expert track against its baselines (see bench/README.md)."""
