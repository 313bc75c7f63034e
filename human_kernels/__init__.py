"""The expert track: one hand-written kernel per task (k0..k9). Each file is a kernel
module: TASK, AUTHOR, optional CONFIG and prepare(), and run(inputs, prepared, config)."""
