"""`python -m llmgw.engines.llamacpp`: the llama.cpp engine standalone (what the agent starts)."""

from __future__ import annotations

import argparse
import sys

from llmgw.engines.llamacpp.cli import configure, run


def main(argv: list[str] | None = None) -> int:
    """Parse options and serve."""
    parser = argparse.ArgumentParser(prog="llmgw engine llamacpp",
                                     description="A GGUF model on the CPU with llama.cpp, behind the OpenAI API.")
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
