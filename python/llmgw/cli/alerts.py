"""`llmgw alerts`: the Prometheus alerting rules for llmgw's metrics."""

from __future__ import annotations

import argparse
import sys
from importlib import resources


def rules() -> str:
    """The rule file shipped with the package (`llmgw/alerts.yaml`)."""
    return resources.files("llmgw").joinpath("alerts.yaml").read_text(encoding="utf-8")


def configure(parser: argparse.ArgumentParser) -> None:
    """No options: the rules go to standard output."""
    parser.epilog = ("Save them where Prometheus reads its rule_files: "
                     "llmgw alerts > /etc/prometheus/rules/llmgw.yml")


def run(args: argparse.Namespace) -> int:
    """Prints the rules."""
    sys.stdout.write(rules())
    return 0
