"""`llmgw version`."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace) -> int:
    """Prints the package and Rust core versions."""
    from llmgw import __version__, _core

    print(f"llmgw {__version__} (core {_core.__version__})")
    return 0
