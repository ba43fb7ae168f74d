"""The agent service's bind: a port taken between `llmgw server`'s check and the bind
itself gets the same sentence as the check, naming the setting to change."""

from __future__ import annotations

import asyncio
import socket

import pytest

from llmgw.control import agents


def test_a_taken_agent_port_says_which_setting_to_change() -> None:
    async def main() -> None:
        server = agents._server()
        with socket.create_server(("127.0.0.1", 0)) as taken:
            port = taken.getsockname()[1]
            with pytest.raises(RuntimeError) as e:
                agents._listen(server, f"127.0.0.1:{port}", None, "agent_join_port")
        await server.stop(None)
        message = str(e.value)
        assert message.startswith(f"cannot listen for agents on 127.0.0.1:{port}: ")
        assert message.endswith(
            "another process holds that port (another control plane?). Stop it, or set "
            "control_plane.agent_join_port in --config to a free port")

    asyncio.run(main())
