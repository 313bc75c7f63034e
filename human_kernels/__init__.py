"""The expert track: one hand-written kernel per task that has one, human_kernels/<task
name>.py (every CODA task k0..k9 does; a new task may have none). Each file is a kernel
module: TASK, AUTHOR, optional CONFIG and prepare(), and run(inputs, prepared, config)."""
