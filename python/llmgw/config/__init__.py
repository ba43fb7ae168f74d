"""server.yaml: its schema, its duration and size types, and its one loader (`file.py`).

`gateway.py` is the `gateway:` section (what the data plane reads), `units.py` the duration and
size types every section uses, `check.py` the walk that finds every fault in raw YAML, and
`file.py` the whole file: one Struct whose fields are the sections (`gateway`, `control_plane`,
`models`). `file.py` joins in the control plane's sections, so it alone imports control/ and is
for the command line; the names here are the gateway section's and its errors, which the data
plane imports without pulling in the control plane.
"""

from .gateway import (
    CONFIG_ENV,
    ConfigError,
    ControlPlaneLink,
    Endpoint,
    GatewayConfig,
    HealthChecks,
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
    "HealthChecks",
    "RetryBudget",
    "Timeouts",
    "check_http_url",
    "decode_gateway",
    "encode_gateway",
    "is_loopback",
    "parse_endpoint",
    "url_host",
]
