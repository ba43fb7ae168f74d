"""A test-only control plane: accepts agents' streams, records what they send, sends what the test queues."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from llmgw.v1 import agent_pb2 as pb
from llmgw.v1.agent_pb2_grpc import AgentServiceServicer, add_AgentServiceServicer_to_server


class StubControlPlane(AgentServiceServicer):
    """One grpc.aio server on loopback; `send` reaches the agent connected now."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self.outbox: asyncio.Queue[pb.ControlMessage] = asyncio.Queue()
        self.connects = 0
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> int:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        add_AgentServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],  # type: ignore[override]
                      context: grpc.aio.ServicerContext[pb.AgentMessage, pb.ControlMessage]
                      ) -> AsyncIterator[pb.ControlMessage]:  # fmt: skip
        self.connects += 1
        self.outbox = asyncio.Queue()  # commands go to the newest stream only
        outbox = self.outbox

        async def read() -> None:
            async for msg in request_iterator:
                await self.inbox.put(msg)

        reader = asyncio.create_task(read())
        try:
            while True:
                yield await outbox.get()
        finally:
            reader.cancel()

    def send(self, **kw: object) -> None:
        self.outbox.put_nowait(pb.ControlMessage(**kw))  # type: ignore[arg-type]

    async def expect(self, pred: Callable[[pb.AgentMessage], bool], timeout: float = 15) -> pb.AgentMessage:
        """The next message matching `pred` (others are dropped)."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.inbox.get()
                if pred(msg):
                    return msg

    async def status(self, rid: str, state: int, timeout: float = 15) -> pb.ReplicaStatus:
        """The next ReplicaStatus of `rid` in `state`."""
        msg = await self.expect(lambda m: m.WhichOneof("msg") == "replica_status"
                                and m.replica_status.replica_id == rid
                                and m.replica_status.state == state, timeout)  # fmt: skip
        return msg.replica_status
