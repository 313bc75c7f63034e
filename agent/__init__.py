"""The kernel-authoring agent: loop, LLM backends, prompt building, session logs.

    loop.py        the session: where it writes (data_path, beside), model turn, tools, feedback, budgets (estimated before each
                   request), resume of a killed session or one that ended on a backend error; ScreenWatch: the pack's
                   screening before it, with progress, counted against the wall-time budget
    tools.py       the model's tools; every kernel through eval.evaluate, with a per-task timeout
    feedback.py    what the model hears about an evaluation (plain text, paths scrubbed)
    session.py     the log's events (JSONL, append-only) and the session's configuration
    transcript.py  a session's state rebuilt from its log (resume)
    pack.py        the knowledge pack: system prompt, pages, examples
    screen.py      the pack's content rule: no code a session reads would pass its task's check
    pricing.py     dollars per model (or the session's --price-in/--price-out)
    replay.py      replay and fork of a recorded session
    sessions.py    epiforge sessions list|show; counts_as_pass: which sessions pass@k counts
    runs.py        generate --runs N --concurrency C: N sessions side by side (run_pool), pass@k
    ablate.py      knowledge-pack ablations, through runs.py's run_pool (--concurrency C)
    cli.py         the agent's subcommands; backends/: anthropic, openai, command, replay
"""
