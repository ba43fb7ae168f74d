"""`llmgw server init`: the cluster CA and the agent port's server certificate, once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the options of `server init`."""
    from llmgw.control.settings import default_data_dir

    parser.add_argument("--data-dir", metavar="DIR", type=Path, default=None,
                        help=f"the control plane's data dir (default {default_data_dir()})")
    parser.add_argument("--san", metavar="HOST", action="append", default=[],
                        help="a name or IP agents dial the control plane by; repeat for several "
                             "(localhost, 127.0.0.1 and ::1 are always in)")
    parser.description = (
        "Create the cluster CA and the agent port's certificate in the data dir. For a second "
        "control plane on the same PostgreSQL, copy ca.crt and ca.key from the first into its "
        "data dir and run this there: it makes only that control plane's certificate.")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing CA (every node must then join again)")


def run(args: argparse.Namespace) -> int:
    """Creates the files; exit status 2 with a sentence when they exist (without --force)."""
    from llmgw.control import pki
    from llmgw.control.settings import default_data_dir

    data_dir = (args.data_dir or default_data_dir()).expanduser().absolute()
    try:
        fingerprint, reused = pki.init(data_dir, list(args.san), force=args.force)
    except pki.PkiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write the certificates into {data_dir}: {e.strerror}; give "
              "--data-dir a directory this user can write", file=sys.stderr)
        return 2
    hosts = ", ".join(dict.fromkeys([*args.san, *pki.ALWAYS_SANS]))
    ca = (f"used the cluster CA already in {data_dir}" if reused else
          f"created the cluster CA in {data_dir} ({pki.CA_CERT}, {pki.CA_KEY})")
    print(f"{ca} and made the agent port's certificate for {hosts} "
          f"({pki.SERVER_CERT}, {pki.SERVER_KEY})")
    print(f"CA SHA-256: {fingerprint}")
    print("next: start `llmgw server`, then make a token for each node with "
          "`llmgw ctl nodes join-token`")
    return 0
