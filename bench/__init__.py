"""llmgw's load-test harness: `python -m bench load|run|soak|pool|table` (see bench/README.md)."""
