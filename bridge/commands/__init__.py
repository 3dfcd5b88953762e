"""One module per ``lakegate`` subcommand: ``add_arguments(parser)`` and ``run(args, config)``."""
