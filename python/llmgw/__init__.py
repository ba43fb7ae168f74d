"""llmgw: an OpenAI-compatible LLM gateway and GPU-cluster control plane.

This module imports nothing heavy: the Rust extension (`llmgw._core`) and the
servers are loaded only by the commands that use them.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("llmgw")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
