"""The agent's subcommands of the epiforge CLI (generate, replay, ...)."""


def add_commands(sub) -> None:
    """Register the agent's subcommands on the epiforge parser."""
