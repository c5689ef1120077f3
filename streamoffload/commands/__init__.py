"""One module per CLI subcommand. Each defines ``register(subparsers)``, which adds its parser and
sets ``func`` (called with the parsed namespace, returning an exit code). ``streamoffload.cli``
discovers the modules here, so adding a command never edits a shared file."""
