"""The `dra-driver` subcommands: each module has `add_arguments(parser)` and `run(args) -> int`."""
