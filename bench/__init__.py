"""llmgw's load-test harness: `python -m bench load|run|soak` (see bench/README.md)."""
