"""The ``odelm`` command line: one parser for every subcommand, and each subcommand's code."""
