"""server.yaml: its schema, the duration and size types, and the one loader (`file.py`, which alone imports control/).

`gateway.py` is the `gateway:` section (what the data plane reads), `units.py` the duration and
size types every section uses, and `file.py` the whole file: one Struct whose fields are the
sections (`gateway`, `control_plane`, `models`), checked with every fault reported by its path.
`file.py` joins in the control plane's sections, so it imports control/ and is for the command
line; this package's own names are the gateway section's and the errors, which the data plane
imports without pulling in the control plane.
"""

from .gateway import (
    CONFIG_ENV,
    ConfigError,
    ControlPlaneLink,
    Endpoint,
    GatewayConfig,
    Health,
    RetryBudget,
    Timeouts,
    check_http_url,
    decode_gateway,
    encode_gateway,
    is_loopback,
    parse_endpoint,
    url_host,
)

__all__ = [
    "CONFIG_ENV",
    "ConfigError",
    "ControlPlaneLink",
    "Endpoint",
    "GatewayConfig",
    "Health",
    "RetryBudget",
    "Timeouts",
    "check_http_url",
    "decode_gateway",
    "encode_gateway",
    "is_loopback",
    "parse_endpoint",
    "url_host",
]
