"""The `llmgw` command: one table of subcommands, each a module with configure() and run()."""
