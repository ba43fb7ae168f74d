"""`python -m llmgw.engines.sim`: run the engine simulator standalone."""

from __future__ import annotations

import argparse
import sys

from llmgw.engines.sim.cli import configure, run


def main(argv: list[str] | None = None) -> int:
    """Parse options and serve."""
    parser = argparse.ArgumentParser(
        prog="llmgw engine sim",
        description="Simulated vLLM engine (OpenAI HTTP API, no GPU) for tests and benchmarks.",
    )
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
