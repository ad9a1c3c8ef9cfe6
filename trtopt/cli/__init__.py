"""Command-line interface: one module per subcommand, registered in `trtopt.cli.main.COMMANDS`."""
