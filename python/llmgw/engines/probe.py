"""Readiness probes: one HTTP GET to an engine's probe URL, ready on a 200."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from llmgw.engines.launch import Launch

PROBE_TIMEOUT_S = 2.0


async def http_probe(launch: Launch, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when `launch.probe_url` answers 200 within `timeout`; any error is "not ready"."""
    url = urlsplit(launch.probe_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    path = url.path or "/"
    headers = "".join(f"{k}: {v}\r\n" for k, v in launch.probe_headers.items())
    request = f"GET {path} HTTP/1.1\r\nhost: {url.netloc}\r\n{headers}connection: close\r\n\r\n"
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request.encode())
                status_line = await reader.readline()
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False
    parts = status_line.split()
    return len(parts) >= 2 and parts[1] == b"200"
