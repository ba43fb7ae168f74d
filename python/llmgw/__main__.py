"""`python -m llmgw` is the `llmgw` command."""

import sys

from llmgw.cli.main import main

sys.exit(main())
