"""The kernel-authoring agent: loop, LLM backends, prompt building, session logs."""
